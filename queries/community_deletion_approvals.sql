-- name: DeletionApprovalGet :one
SELECT * FROM community_deletion_approvals WHERE request_id = @request_id::uuid;
