package deletion

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

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
// are kept as a checkpoint. What it refuses (an unknown id, a request not
// blocked, one an executor holds right now) it says in the operator's
// words, decided under the row's lock in the transaction that unblocks:
// a look before the lock read around an executor blocking the request at
// that moment, and told the operator it was not blocked.
func Unblock(ctx context.Context, pool *pgxpool.Pool, id uuid.UUID, by, reason string) (db.CommunityDeletionRequest, error) {
	var req db.CommunityDeletionRequest
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		cur, err := q.DeletionRequestLockForUnblock(ctx, id)
		switch {
		case dberr.IsNotFound(err):
			return fmt.Errorf("no deletion request %s", id)
		case err != nil:
			return dberr.Interpret(err)
		case cur.BlockedAt == nil || cur.Stage == StageRetentionPending:
			return fmt.Errorf("%w: deletion request %s is not blocked (stage %s): there is nothing to unblock", dberr.ErrDeletionSafety, id, cur.Stage)
		case cur.Leased:
			return fmt.Errorf("%w: deletion request %s is held by executor %q (lease generation %d) until %s: it is working on the request right now; unblock it once that run ends or its lease runs out",
				dberr.ErrDeletionSafety, id, derefString(cur.LeaseOwner), cur.LeaseGeneration, cur.LeaseUntil.UTC().Format(time.RFC3339))
		}
		req, err = q.DeletionRequestUnblock(ctx, db.DeletionRequestUnblockParams{ID: id, UnblockedBy: by, Reason: reason})
		return dberr.Interpret(err)
	})
	return req, err
}

func derefString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
