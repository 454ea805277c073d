package deletion

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/media"
)

// purgeOrder sorts the community-scoped tables so that a table comes
// before every table it references: deleting in this order never trips a
// foreign key, whatever its ON DELETE action.
func purgeOrder(ctx context.Context, conn db.DBTX) ([]string, error) {
	tables, err := ScopedTables(ctx, conn)
	if err != nil {
		return nil, err
	}
	edges, err := scopedForeignKeys(ctx, conn)
	if err != nil {
		return nil, err
	}
	referencedBy := map[string][]string{} // parent -> children
	for _, e := range edges {
		referencedBy[e.Parent] = append(referencedBy[e.Parent], e.Child)
	}
	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(t string) error
	visit = func(t string) error {
		switch state[t] {
		case 1:
			return permanent("foreign keys among community-scoped tables form a cycle through %s", t)
		case 2:
			return nil
		}
		state[t] = 1
		children := slices.Clone(referencedBy[t])
		slices.Sort(children)
		for _, c := range children {
			if err := visit(c); err != nil {
				return err
			}
		}
		state[t] = 2
		order = append(order, t)
		return nil
	}
	slices.Sort(tables)
	for _, t := range tables {
		if err := visit(t); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// purgePostgres deletes the community's rows table by table in bounded
// batches, each batch its own transaction under the verified lease and
// fence (the community is fenced: nothing else writes to it meanwhile), so
// memory and transaction size stay flat whatever the community's size.
// The last transaction proves every scoped table empty and turns the
// community row into its tombstone.
func (e *Executor) purgePostgres(ctx context.Context, l lease, inv Inventory) error {
	order, err := purgeOrder(ctx, e.pool)
	if err != nil {
		return err
	}
	var rowsTotal int64
	for _, c := range inv.Schema.RowCounts {
		rowsTotal += c.Rows
	}
	purged, err := e.purgedSoFar(ctx, l)
	if err != nil {
		return err
	}
	var deleted int64
	for _, n := range purged {
		deleted += n
	}
	for _, table := range order {
		// name: DeletionPurgeBatch (one statement per scoped table)
		sql := fmt.Sprintf("-- name: DeletionPurgeBatch\nDELETE FROM %[1]s WHERE community_id = $1 AND ctid = ANY(ARRAY("+
			"SELECT ctid FROM %[1]s WHERE community_id = $1 LIMIT $2))", pgx.Identifier{table}.Sanitize())
		for {
			var n int64
			err := e.inTx(ctx, func(q *db.Queries, tx pgx.Tx) error {
				if err := lockSchemaShared(ctx, tx); err != nil {
					return err
				}
				if _, err := q.DeletionRequestEnterExecutor(ctx, db.DeletionRequestEnterExecutorParams{ID: l.id, Owner: l.owner, Generation: l.gen, Stage: StageBindingsRemoved}); err != nil {
					return err
				}
				tag, err := tx.Exec(ctx, sql, l.community, e.cfg.PurgeBatchRows)
				if n = tag.RowsAffected(); err != nil || n == 0 {
					return err
				}
				// The table's running count commits with the batch it counts.
				return e.recordPurged(ctx, q, l, table, "started", purged[table]+n)
			})
			if err != nil {
				return fmt.Errorf("purge %s: %w", table, err)
			}
			purged[table] += n
			deleted += n
			e.report(Progress{RequestID: l.id, Stage: StageBindingsRemoved, Step: "purge " + table,
				RowsDeleted: deleted, RowsTotal: max(rowsTotal, deleted), Generation: l.gen})
			if n < int64(e.cfg.PurgeBatchRows) {
				break
			}
		}
		// Under the lease like the batches: an executor that lost it (frozen
		// past it while an heir took over) records nothing.
		if err := e.inTx(ctx, func(q *db.Queries, _ pgx.Tx) error {
			if _, err := q.DeletionRequestEnterExecutor(ctx, db.DeletionRequestEnterExecutorParams{ID: l.id, Owner: l.owner, Generation: l.gen, Stage: StageBindingsRemoved}); err != nil {
				return err
			}
			return e.recordPurged(ctx, q, l, table, "completed", purged[table])
		}); err != nil {
			return err
		}
	}
	detail, _ := json.Marshal(map[string]any{"rows": purged, "total_rows": deleted})
	return e.inTx(ctx, func(q *db.Queries, _ pgx.Tx) error {
		return q.DeletionRequestTombstone(ctx, db.DeletionRequestTombstoneParams{ID: l.id, Owner: l.owner, Generation: l.gen, Detail: detail})
	})
}

// purgeUnitPrefix starts the checkpoint of one table's purge:
// purge:<table>, whose detail counts the rows deleted so far.
const purgeUnitPrefix = "purge:"

func (e *Executor) recordPurged(ctx context.Context, q *db.Queries, l lease, table, status string, rows int64) error {
	detail, _ := json.Marshal(map[string]any{"rows": rows})
	return q.DeletionCheckpointUpsert(ctx, db.DeletionCheckpointUpsertParams{RequestID: l.id, Stage: StageBindingsRemoved,
		UnitKey: purgeUnitPrefix + table, Status: status, Generation: l.gen, Detail: detail})
}

// purgedSoFar reads back the rows each table's purge has deleted, from
// the checkpoints its batches committed with them: an executor taking
// over from one that stopped mid-purge counts the rows that one deleted
// too (counting only its own batches, the heir's evidence said 10 of 30
// users).
func (e *Executor) purgedSoFar(ctx context.Context, l lease) (map[string]int64, error) {
	checkpoints, err := db.New(e.pool).DeletionCheckpointsOfRequest(ctx, l.id)
	if err != nil {
		return nil, err
	}
	purged := map[string]int64{}
	for _, c := range checkpoints {
		table, ok := strings.CutPrefix(c.UnitKey, purgeUnitPrefix)
		if c.Stage != StageBindingsRemoved || !ok {
			continue
		}
		var recorded struct{ Rows int64 }
		if err := json.Unmarshal(c.Detail, &recorded); err != nil {
			return nil, permanent("checkpoint %s does not decode: %v", c.UnitKey, err)
		}
		purged[table] = recorded.Rows
	}
	return purged, nil
}

// purgeCache unlinks every Redis key of the community. Natural expiry is
// not enough: some keys never expire.
func (e *Executor) purgeCache(ctx context.Context, l lease) error {
	var removed int64
	if e.redis != nil {
		var cursor uint64
		for {
			keys, next, err := e.redis.Scan(ctx, cursor, RedisPattern(l.community), 1000).Result()
			if err != nil {
				return fmt.Errorf("redis scan: %w", err)
			}
			if len(keys) > 0 {
				n, err := e.redis.Unlink(ctx, keys...).Result()
				if err != nil {
					return fmt.Errorf("redis unlink: %w", err)
				}
				removed += n
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	detail, _ := json.Marshal(map[string]any{"deleted_keys": removed, "redis_configured": e.redis != nil})
	return e.inTx(ctx, func(q *db.Queries, _ pgx.Tx) error {
		if _, err := q.DeletionRequestEnterExecutor(ctx, db.DeletionRequestEnterExecutorParams{ID: l.id, Owner: l.owner, Generation: l.gen, Stage: StagePostgresPurged}); err != nil {
			return err
		}
		if _, err := q.DeletionRequestAdvance(ctx, db.DeletionRequestAdvanceParams{ID: l.id, Owner: l.owner, Generation: l.gen, FromStage: StagePostgresPurged}); err != nil {
			return err
		}
		return q.DeletionCheckpointUpsert(ctx, db.DeletionCheckpointUpsertParams{RequestID: l.id, Stage: StagePostgresPurged,
			UnitKey: "purge_cache_namespace", Status: "completed", Generation: l.gen, Detail: detail})
	})
}

// errLateObject is transient: something appeared (or survived) after its
// deletion; the next attempt repeats the whole proof.
var errLateObject = errors.New("late object")

// verify proves absence in all three stores independently of the steps
// that deleted: a crash after it repeats the whole proof.
func (e *Executor) verify(ctx context.Context, l lease, row db.CommunityDeletionRequest) error {
	if err := e.inTx(ctx, func(q *db.Queries, _ pgx.Tx) error {
		return q.DeletionRequestVerifyPostgres(ctx, db.DeletionRequestVerifyPostgresParams{ID: l.id, Owner: l.owner, Generation: l.gen})
	}); err != nil {
		return err
	}
	if e.store != nil {
		for _, prefix := range media.CommunityPrefixes(l.community) {
			err := e.store.Walk(ctx, prefix, "", func(key string, _ int64) error {
				return fmt.Errorf("%w: %s still exists", errLateObject, key)
			})
			if err != nil {
				return err
			}
		}
		if err := e.verifySharedBlobs(ctx, l); err != nil {
			return err
		}
	}
	for pass := 1; pass <= 2 && e.redis != nil; pass++ {
		var cursor uint64
		for {
			keys, next, err := e.redis.Scan(ctx, cursor, RedisPattern(l.community), 1000).Result()
			if err != nil {
				return fmt.Errorf("redis scan: %w", err)
			}
			if len(keys) > 0 {
				return fmt.Errorf("%w: redis key %s still exists (pass %d)", errLateObject, keys[0], pass)
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	redisProof := any(true)
	if e.redis == nil {
		redisProof = "not configured"
	}
	objectProof := any(true)
	if e.store == nil {
		objectProof = "not configured"
	}
	detail, _ := json.Marshal(map[string]any{"postgres": true, "object_store": objectProof, "redis": redisProof})
	return e.inTx(ctx, func(q *db.Queries, _ pgx.Tx) error {
		return q.DeletionRequestMarkVerified(ctx, db.DeletionRequestMarkVerifiedParams{ID: l.id, Owner: l.owner, Generation: l.gen, Detail: detail})
	})
}

// verifySharedBlobs: every candidate blob is gone or referenced by another
// community.
func (e *Executor) verifySharedBlobs(ctx context.Context, l lease) error {
	q := db.New(e.pool)
	communities, err := media.CommunitiesWithMedia(ctx, e.store)
	if err != nil {
		return err
	}
	for n := int64(0); ; n++ {
		c, err := q.DeletionManifestChunk(ctx, db.DeletionManifestChunkParams{RequestID: l.id, ChunkNo: n})
		if dberr.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if c.KeyClass != ClassSharedBlob {
			return nil // shared blob chunks come first
		}
		var keys []string
		if err := json.Unmarshal(c.Keys, &keys); err != nil {
			return permanent("manifest chunk %d does not decode: %v", n, err)
		}
		for _, key := range keys {
			if _, err := e.store.Stat(ctx, key); errors.Is(err, media.ErrNotFound) {
				continue
			} else if err != nil {
				return err
			}
			referenced, err := media.BlobReferenced(ctx, e.store, key, communities, l.community)
			if err != nil {
				return err
			}
			if !referenced {
				return fmt.Errorf("%w: shared blob %s exists with no other community referencing it", errLateObject, key)
			}
		}
	}
}

// finish records what V1 leaves to time and other processes, and ends the
// request.
func (e *Executor) finish(ctx context.Context, l lease) error {
	detail, _ := json.Marshal(map[string]any{
		"not_erased": []string{"database backups and WAL archives", "object store provider retention and versions",
			"the communities tombstone row (keeps the host reserved)", "deletion control-plane evidence rows",
			"members' data in other communities", "shared blobs another community still references"},
	})
	return e.inTx(ctx, func(q *db.Queries, _ pgx.Tx) error {
		if _, err := q.DeletionRequestEnterExecutor(ctx, db.DeletionRequestEnterExecutorParams{ID: l.id, Owner: l.owner, Generation: l.gen, Stage: StageLogicallyVerified}); err != nil {
			return err
		}
		if err := q.DeletionCheckpointUpsert(ctx, db.DeletionCheckpointUpsertParams{RequestID: l.id, Stage: StageLogicallyVerified,
			UnitKey: "retention_physical_expiry_pending", Status: "completed", Generation: l.gen, Detail: detail}); err != nil {
			return err
		}
		_, err := q.DeletionRequestAdvance(ctx, db.DeletionRequestAdvanceParams{ID: l.id, Owner: l.owner, Generation: l.gen, FromStage: StageLogicallyVerified})
		return err
	})
}
