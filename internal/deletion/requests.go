package deletion

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/media"
)

// Submit opens the deletion of the community at host and freezes its
// inventory, which an operator then approves. Retried by the same
// requester, it returns the request it already made: after one killed
// before its inventory froze (that retry freezes it), and while another
// retry runs at the same moment.
func Submit(ctx context.Context, pool *pgxpool.Pool, store media.Store, host, requestedBy, reason string) (db.CommunityDeletionRequest, error) {
	q := db.New(pool)
	var why *string
	if reason != "" {
		why = &reason
	}
	req, err := q.DeletionRequestSubmit(ctx, db.DeletionRequestSubmitParams{Host: host, RequestedBy: requestedBy, Reason: why})
	if err != nil {
		return req, dberr.Interpret(err)
	}
	if req.Stage != StageSubmitted {
		return req, nil
	}
	inv, err := BuildInventory(ctx, pool, store, req.CommunityID)
	if err != nil {
		return req, err
	}
	raw, err := json.Marshal(inv)
	if err != nil {
		return req, err
	}
	digest, err := inv.Digest()
	if err != nil {
		return req, err
	}
	frozen, err := q.DeletionRequestFreezeInventory(ctx, db.DeletionRequestFreezeInventoryParams{ID: req.ID, Manifest: raw, Digest: digest})
	if err != nil {
		// The same requester's submit running at the same moment (a second
		// terminal, a retry of one that seemed to hang) froze its inventory
		// first: answer as a retry after it would, with the request as it
		// stands, not with a failure over a request that is fine.
		if now, gerr := q.DeletionRequestGet(ctx, req.ID); gerr == nil && now.Stage == StageInventoried && now.BlockedAt == nil {
			return now, nil
		}
		return req, dberr.Interpret(err)
	}
	return frozen, nil
}

// BuildInventory reads the live catalog, the community's row counts and a
// summary of its object keys.
func BuildInventory(ctx context.Context, pool *pgxpool.Pool, store media.Store, community uuid.UUID) (Inventory, error) {
	scoped, err := ScopedTables(ctx, pool)
	if err != nil {
		return Inventory{}, err
	}
	fenced, err := FencedTables(ctx, pool)
	if err != nil {
		return Inventory{}, err
	}
	inv := Inventory{Schema: SchemaManifest{ScopedTables: sortedCopy(scoped), FencedTables: sortedCopy(fenced), RowCounts: []TableCount{}}}
	for _, table := range inv.Schema.ScopedTables {
		var n int64
		// name: DeletionInventoryRowCount (one statement per scoped table)
		sql := fmt.Sprintf("-- name: DeletionInventoryRowCount\nSELECT count(*) FROM %s WHERE community_id = $1", pgx.Identifier{table}.Sanitize())
		if err := pool.QueryRow(ctx, sql, community).Scan(&n); err != nil {
			return Inventory{}, fmt.Errorf("count %s: %w", table, err)
		}
		inv.Schema.RowCounts = append(inv.Schema.RowCounts, TableCount{Table: table, Rows: n})
	}
	prefixes, err := summarizeBindings(ctx, store, community)
	if err != nil {
		return Inventory{}, err
	}
	inv.Storage = StorageManifest{Version: StorageManifestVersion, Prefixes: prefixes, MediaStore: mediaStoreState(store)}
	return inv, nil
}

// Approve records approver's approval of the request's exact inventory:
// the digest is recomputed from the stored manifest and must match.
func Approve(ctx context.Context, pool *pgxpool.Pool, id uuid.UUID, approvedBy, note string) (db.CommunityDeletionRequest, error) {
	q := db.New(pool)
	req, err := q.DeletionRequestGet(ctx, id)
	if dberr.IsNotFound(err) {
		return req, fmt.Errorf("no deletion request %s", id)
	}
	if err != nil {
		return req, dberr.Interpret(err)
	}
	if req.Stage != StageInventoried {
		return req, fmt.Errorf("%w: deletion request %s is at stage %s, not waiting for approval", dberr.ErrDeletionSafety, id, req.Stage)
	}
	if req.BlockedReason != nil {
		return req, fmt.Errorf("%w: deletion request %s is blocked (%s): fix that, then `buzz-admin deletions unblock` it before approving",
			dberr.ErrDeletionSafety, id, *req.BlockedReason)
	}
	inv, err := DecodeInventory(req.InventoryManifest)
	if err != nil {
		return req, err
	}
	digest, err := inv.Digest()
	if err != nil {
		return req, err
	}
	var n *string
	if note != "" {
		n = &note
	}
	req, err = q.DeletionRequestApprove(ctx, db.DeletionRequestApproveParams{ID: id, ApprovedBy: approvedBy, Note: n, Digest: digest})
	return req, dberr.Interpret(err)
}

// Unblock clears a block after an operator fixed its cause; who and why
// are kept as a checkpoint.
func Unblock(ctx context.Context, pool *pgxpool.Pool, id uuid.UUID, by, reason string) (db.CommunityDeletionRequest, error) {
	q := db.New(pool)
	// Read first only to say plainly what the unblock function, which
	// decides under the row's lock, would refuse in its own words.
	req, err := q.DeletionRequestGet(ctx, id)
	if dberr.IsNotFound(err) {
		return req, fmt.Errorf("no deletion request %s", id)
	}
	if err != nil {
		return req, dberr.Interpret(err)
	}
	if req.BlockedAt == nil || req.Stage == StageRetentionPending {
		return req, fmt.Errorf("%w: deletion request %s is not blocked (stage %s): there is nothing to unblock", dberr.ErrDeletionSafety, id, req.Stage)
	}
	req, err = q.DeletionRequestUnblock(ctx, db.DeletionRequestUnblockParams{ID: id, UnblockedBy: by, Reason: reason})
	return req, dberr.Interpret(err)
}
