package deletion_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/crossrelay"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/deletion"
	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/media/s3test"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

func testConfig() deletion.Config {
	cfg := deletion.DefaultConfig()
	cfg.Lease = 10 * time.Second
	cfg.RetryBaseDelay = time.Second
	return cfg
}

// snapshotRows is every row of the community in every scoped table, as
// JSON, in a stable order.
func snapshotRows(t *testing.T, f *fixture, community uuid.UUID) map[string]string {
	t.Helper()
	tables, err := deletion.ScopedTables(f.ctx, f.pool)
	require.NoError(t, err)
	out := map[string]string{}
	for _, table := range tables {
		var rows string
		err := f.pool.QueryRow(f.ctx, `SELECT coalesce(jsonb_agg(to_jsonb(t) ORDER BY to_jsonb(t)::text), '[]')::text FROM `+
			pgx.Identifier{table}.Sanitize()+` t WHERE community_id = $1`, community).Scan(&rows)
		require.NoError(t, err)
		out[table] = rows
	}
	return out
}

func rowCount(t *testing.T, f *fixture, community uuid.UUID) int {
	t.Helper()
	n := 0
	for table, rows := range snapshotRows(t, f, community) {
		var list []json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(rows), &list), table)
		n += len(list)
	}
	return n
}

// snapshotObjects is every object under prefixes plus the named blobs,
// key -> bytes.
func snapshotObjects(t *testing.T, store media.Store, prefixes []string, blobs ...string) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	read := func(key string) {
		obj, _, err := store.Open(ctx, key)
		if err != nil {
			out[key] = "<" + err.Error() + ">"
			return
		}
		defer obj.Close()
		b, err := io.ReadAll(obj)
		require.NoError(t, err)
		out[key] = string(b)
	}
	for _, p := range prefixes {
		keys, err := store.List(ctx, p)
		require.NoError(t, err)
		for _, k := range keys {
			read(k)
		}
	}
	for _, b := range blobs {
		read(b)
	}
	return out
}

func upload(t *testing.T, svc *media.Service, community uuid.UUID, content string) media.Descriptor {
	t.Helper()
	d, err := svc.Upload(context.Background(), community, strings.Repeat("ab", 32), strings.NewReader(content), nil)
	require.NoError(t, err)
	return d
}

// The whole deletion against real Postgres, a real media store (both
// kinds) and a real redis-server: a second community sharing channel ids,
// event ids and a blob is untouched row by row and object by object, the
// deleted one is gone from all three stores, its reconnect gets 404, and
// a rerun of the finished request is refused. Kills: a purge or object
// deletion missing its community predicate, a shared blob deleted while
// referenced, a Redis purge by a wider pattern.
func TestDeleteCommunityLeavesTheBystanderUntouched(t *testing.T) {
	t.Parallel()
	stores := map[string]func(t *testing.T) media.Store{
		"fs": func(t *testing.T) media.Store {
			s, err := media.NewFSStore(t.TempDir())
			require.NoError(t, err)
			return s
		},
		"s3": func(t *testing.T) media.Store { return s3test.Store(t) },
	}
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			relay := relaytest.StartOn(t, f.pool)
			doomedHost, bystanderHost := "doomed-"+name+".test", "bystander-"+name+".test"
			doomed := relay.AddCommunity(t, doomedHost)
			bystander := relay.AddCommunity(t, bystanderHost)
			for i := 0; i < 3; i++ {
				ch, ev, pk := uuid.New(), randomBytes(32), randomBytes(32)
				require.NoError(t, seedRows(f.ctx, f.pool, doomed, ch, ev, pk))
				require.NoError(t, seedRows(f.ctx, f.pool, bystander, ch, ev, pk), "same channel and event ids in both")
			}

			store := newStore(t)
			svc := media.NewService(store, media.Limits{MaxBytes: 1 << 20, AllowedTypes: []string{"text/plain"}}, nil)
			shared := upload(t, svc, doomed, "shared bytes")
			sharedToo := upload(t, svc, bystander, "shared bytes")
			require.Equal(t, shared.Blob, sharedToo.Blob, "one object behind both communities' uploads")
			mine := upload(t, svc, doomed, "only the doomed community's bytes")
			theirs := upload(t, svc, bystander, "only the bystander's bytes")
			// Deleted by its member before, and its blob swept: on the
			// filesystem that leaves the blob's directory under _uploads/,
			// empty.
			gone := upload(t, svc, doomed, "bytes its member deleted before")
			require.NoError(t, svc.Delete(f.ctx, doomed, gone.SHA256, strings.Repeat("ab", 32)))
			_, err := (&media.Sweeper{Service: svc, Pool: f.pool, Claimant: uuid.New(), Batch: 100}).Sweep(f.ctx)
			require.NoError(t, err)

			rdb := redis.NewClient(mustRedisOptions(t))
			t.Cleanup(func() { rdb.Close() })
			for i := 0; i < 50; i++ {
				require.NoError(t, rdb.Set(f.ctx, "buzz:"+doomed.String()+":presence:"+strconv.Itoa(i), "x", 0).Err())
			}
			require.NoError(t, rdb.Set(f.ctx, "buzz:"+bystander.String()+":presence:0", "y", 0).Err())

			beforeRows := snapshotRows(t, f, bystander)
			bystanderObjects := func() map[string]string {
				return snapshotObjects(t, store, media.CommunityPrefixes(bystander), shared.Blob, theirs.Blob)
			}
			beforeObjects := bystanderObjects()
			require.Len(t, beforeObjects, 6)

			listen, err := pgx.Connect(f.ctx, f.pool.Config().ConnString())
			require.NoError(t, err)
			defer listen.Close(context.Background())
			_, err = listen.Exec(f.ctx, "LISTEN "+community.ClosedChannel)
			require.NoError(t, err)
			sub := rdb.Subscribe(f.ctx, crossrelay.ControlChannel(doomed))
			defer sub.Close()
			_, err = sub.Receive(f.ctx)
			require.NoError(t, err)

			req := f.submitAndApprove(doomedHost, store)
			var progress []deletion.Progress
			exec := deletion.NewExecutor(deletion.Options{Pool: f.pool, Store: store, Redis: rdb, ID: "exec-1", Config: testConfig(),
				Progress: func(p deletion.Progress) { progress = append(progress, p) }})
			out, err := exec.Run(f.ctx, req.ID)
			require.NoError(t, err)
			require.Equal(t, deletion.StageRetentionPending, out.Stage, "%+v", out)
			require.False(t, out.Failed())
			require.NotEmpty(t, progress)

			// The disconnect signal went out on both paths.
			ctx, cancel := context.WithTimeout(f.ctx, time.Minute)
			defer cancel()
			n, err := listen.WaitForNotification(ctx)
			require.NoError(t, err)
			require.Equal(t, doomed.String(), n.Payload)
			msg, err := sub.ReceiveMessage(ctx)
			require.NoError(t, err)
			require.Equal(t, crossrelay.DisconnectCommunity, msg.Payload)

			// PostgreSQL: the doomed community has no row left, its
			// tombstone keeps the host; the bystander is identical.
			require.Zero(t, rowCount(t, f, doomed))
			require.Equal(t, beforeRows, snapshotRows(t, f, bystander))
			row, err := f.q.CommunityByHost(f.ctx, doomedHost)
			require.NoError(t, err)
			require.Equal(t, "tombstone", row.DeletionState)
			require.NotNil(t, row.DeletedAt)
			_, err = f.q.CommunityCreate(f.ctx, doomedHost)
			require.Error(t, err, "the host stays reserved")

			// Objects: the doomed prefixes are empty, its own blob is gone,
			// the shared one and everything of the bystander's are intact.
			for _, p := range media.CommunityPrefixes(doomed) {
				keys, err := store.List(f.ctx, p)
				require.NoError(t, err)
				require.Empty(t, keys, p)
			}
			// Nor is a directory named for it left: on the filesystem one
			// under _uploads/ per blob it had uploaded, named by its hash,
			// whether the deletion removed its files or a member's delete
			// did. Mutations killed: the deletion not pruning the
			// community's empty directories; pruning only those above the
			// files it removed.
			for _, top := range []string{"_meta/", "_uploads/"} {
				names, err := store.Children(f.ctx, top)
				require.NoError(t, err)
				require.NotContains(t, names, doomed.String(), top)
				require.Contains(t, names, bystander.String(), top)
			}
			_, err = store.Stat(f.ctx, mine.Blob)
			require.ErrorIs(t, err, media.ErrNotFound, "a blob no other community references is deleted")
			require.Equal(t, beforeObjects, bystanderObjects())

			// Redis.
			keys, err := rdb.Keys(f.ctx, "buzz:"+doomed.String()+":*").Result()
			require.NoError(t, err)
			require.Empty(t, keys)
			require.Equal(t, "y", rdb.Get(f.ctx, "buzz:"+bystander.String()+":presence:0").Val())

			// Reconnecting to the deleted community: 404 before the upgrade;
			// the bystander still connects.
			_, err = relay.TryDial(doomedHost)
			require.Error(t, err)
			require.Contains(t, err.Error(), "404")
			relay.Dial(t, bystanderHost)

			// Evidence stays; a finished request runs no more.
			cps, err := f.q.DeletionCheckpointsOfRequest(f.ctx, req.ID)
			require.NoError(t, err)
			units := map[string]bool{}
			for _, c := range cps {
				units[c.UnitKey] = true
			}
			for _, u := range []string{"quiesce_serving_writes", "activate_fence", "serving_writes_drained", "chunk:0",
				"remove_storage_bindings", "purge:events", "postgres_tombstone_committed", "purge_cache_namespace",
				"verify_cross_store_absence", "retention_physical_expiry_pending"} {
				require.True(t, units[u], "checkpoint %s", u)
			}
			_, err = exec.Run(f.ctx, req.ID)
			require.ErrorIs(t, err, deletion.ErrNotRunnable)
			_, err = f.pool.Exec(f.ctx, `UPDATE community_deletion_requests SET stage = 'retention_pending', lease_owner = NULL WHERE id = $1`, req.ID)
			require.Equal(t, "23000", sqlState(err), "a finished request never changes")
		})
	}
}

func mustRedisOptions(t *testing.T) *redis.Options {
	t.Helper()
	opts, err := redis.ParseURL(dbtest.RedisURL(t))
	require.NoError(t, err)
	return opts
}

// A dead executor's request is taken over once its lease expires, under
// the next generation; the dead one's late steps and writes are refused.
// Kills: a claim that ignores lease expiry checks, or a write bypass that
// ignores the lease generation.
func TestDeadOwnerLeaseIsTakenOver(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := f.community("takeover.test")
	require.NoError(t, seedRows(f.ctx, f.pool, c, uuid.New(), randomBytes(32), randomBytes(32)))
	req := f.submitAndApprove("takeover.test", nil)
	dead := f.claim(req.ID, "dead-executor", time.Minute)
	require.EqualValues(t, 1, dead.LeaseGeneration)

	exec := deletion.NewExecutor(deletion.Options{Pool: f.pool, ID: "successor", Config: testConfig()})
	_, err := exec.Run(f.ctx, req.ID)
	require.ErrorIs(t, err, deletion.ErrNotRunnable, "a live lease is not taken over")
	// The owner dies and its lease runs out (moved into the past rather than
	// waited for, so a slow machine cannot expire it before the check above).
	_, err = f.pool.Exec(f.ctx, `UPDATE community_deletion_requests SET lease_until = now() - interval '1 second' WHERE id = $1`, req.ID)
	require.NoError(t, err)
	out, err := exec.Run(f.ctx, req.ID)
	require.NoError(t, err)
	require.Equal(t, deletion.StageRetentionPending, out.Stage)
	final, err := f.q.DeletionRequestGet(f.ctx, req.ID)
	require.NoError(t, err)
	require.EqualValues(t, 2, final.LeaseGeneration)

	_, err = f.q.DeletionRequestEnterExecutor(f.ctx, db.DeletionRequestEnterExecutorParams{ID: req.ID, Owner: "dead-executor", Generation: 1, Stage: deletion.StageFenced})
	require.Equal(t, "BZ001", sqlState(err))
	_, err = f.q.DeletionRequestHeartbeat(f.ctx, db.DeletionRequestHeartbeatParams{ID: req.ID, Owner: "dead-executor", Generation: 1, Mode: "run", LeaseSeconds: 60})
	require.Equal(t, "BZ001", sqlState(err))
	err = pgx.BeginFunc(f.ctx, f.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(f.ctx, `SELECT set_config('buzz.deletion_executor_community', $1, true),
			set_config('buzz.deletion_fence_generation', '1', true), set_config('buzz.deletion_lease_generation', '1', true)`, c.String()); err != nil {
			return err
		}
		return insertUser(f.ctx, tx, c)
	})
	require.Equal(t, "55000", sqlState(err), "the dead executor's late write is fenced by its generation")
}

// Eight consecutive transient failures at one stage block the request;
// only an audited unblock clears it, keeping stage, approval and digest.
// Kills: a failure streak that never blocks, or an unblock without a
// recorded reason.
func TestRetryExhaustionBlocksAndUnblockIsAudited(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.community("retry.test")
	req := f.submitAndApprove("retry.test", nil)
	fail := func(gen int64) db.CommunityDeletionRequest {
		r, err := f.q.DeletionRequestRecordFailure(f.ctx, db.DeletionRequestRecordFailureParams{ID: req.ID, Owner: "x", Generation: gen,
			Stage: deletion.StageApproved, Message: "store unreachable", BaseDelaySeconds: 0, MaxStreak: 8})
		require.NoError(t, err)
		return r
	}
	for i := 1; i <= 7; i++ {
		row := f.claim(req.ID, "x", time.Hour)
		r := fail(row.LeaseGeneration)
		require.Nil(t, r.BlockedAt, "failure %d", i)
		require.EqualValues(t, i, r.RetryCount)
	}
	row := f.claim(req.ID, "x", time.Hour)
	r := fail(row.LeaseGeneration)
	require.NotNil(t, r.BlockedAt)
	require.Contains(t, *r.BlockedReason, "8 consecutive failures at stage approved")
	_, err := f.q.DeletionRequestClaim(f.ctx, db.DeletionRequestClaimParams{ID: &req.ID, Owner: "x", LeaseSeconds: 60})
	require.ErrorIs(t, err, pgx.ErrNoRows, "a blocked request is never claimable")

	_, err = deletion.Unblock(f.ctx, f.pool, req.ID, " ", "fixed")
	require.Error(t, err, "who is required")
	u, err := deletion.Unblock(f.ctx, f.pool, req.ID, "oncall@example", "store credentials rotated")
	require.NoError(t, err)
	require.Nil(t, u.BlockedAt)
	require.Zero(t, u.RetryCount)
	require.Equal(t, deletion.StageApproved, u.Stage)
	require.Equal(t, req.InventoryDigest, u.InventoryDigest)
	cps, err := f.q.DeletionCheckpointsOfRequest(f.ctx, req.ID)
	require.NoError(t, err)
	last := cps[len(cps)-1]
	require.True(t, strings.HasPrefix(last.UnitKey, "operator_unblock:"))
	require.Contains(t, string(last.Detail), "store credentials rotated")
	require.Contains(t, string(last.Detail), "8 consecutive failures")
	_, err = deletion.Unblock(f.ctx, f.pool, req.ID, "oncall@example", "again")
	require.Error(t, err, "unblocking a request that is not blocked fails")

	row = f.claim(req.ID, "x", time.Hour)
	require.EqualValues(t, 1, fail(row.LeaseGeneration).RetryCount, "the streak starts over")
}

// The approval binds one exact inventory: no approval for another digest,
// no rewriting the inventory or the target, no forged stage, no claim
// before approval. Kills: dropping the approval foreign key or the request
// guard.
func TestApprovalBindsTheExactInventory(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := f.community("bind.test")
	req, err := deletion.Submit(f.ctx, f.pool, nil, "bind.test", "ops", "")
	require.NoError(t, err)
	again, err := deletion.Submit(f.ctx, f.pool, nil, "bind.test", "ops", "")
	require.NoError(t, err)
	require.Equal(t, req.ID, again.ID, "a retried submit returns the same request")
	_, err = deletion.Submit(f.ctx, f.pool, nil, "bind.test", "someone-else", "")
	require.Error(t, err)

	_, err = f.pool.Exec(f.ctx, `INSERT INTO community_deletion_approvals (request_id, community_id, inventory_digest, approved_by)
		VALUES ($1, $2, $3, 'x')`, req.ID, c, bytes.Repeat([]byte{1}, 32))
	require.Equal(t, "23503", sqlState(err), "an approval of another digest")
	for _, stmt := range []string{
		`UPDATE community_deletion_requests SET inventory_digest = '\x` + strings.Repeat("00", 32) + `' WHERE id = $1`,
		`UPDATE community_deletion_requests SET inventory_manifest = '{}' WHERE id = $1`,
		`UPDATE community_deletion_requests SET community_host = 'other.test' WHERE id = $1`,
		`UPDATE community_deletion_requests SET stage = 'approved' WHERE id = $1`,
		`UPDATE community_deletion_requests SET stage = 'fenced' WHERE id = $1`,
		`DELETE FROM community_deletion_requests WHERE id = $1`,
	} {
		_, err := f.pool.Exec(f.ctx, stmt, req.ID)
		require.Equal(t, "23000", sqlState(err), "%s: %v", stmt, err)
	}
	_, err = f.q.DeletionRequestClaim(f.ctx, db.DeletionRequestClaimParams{ID: &req.ID, Owner: "x", LeaseSeconds: 60})
	require.ErrorIs(t, err, pgx.ErrNoRows, "not claimable before approval")

	// Rows may churn between inventory and fence: counts are observational.
	require.NoError(t, insertUser(f.ctx, f.pool, c))
	_, err = deletion.Approve(f.ctx, f.pool, req.ID, "lead", "")
	require.NoError(t, err)
	for _, stmt := range []string{
		`UPDATE community_deletion_approvals SET approved_by = 'mallory' WHERE request_id = $1`,
		`DELETE FROM community_deletion_approvals WHERE request_id = $1`,
	} {
		_, err := f.pool.Exec(f.ctx, stmt, req.ID)
		require.Equal(t, "23000", sqlState(err), stmt)
	}
	out, err := deletion.NewExecutor(deletion.Options{Pool: f.pool, Config: testConfig()}).Run(f.ctx, req.ID)
	require.NoError(t, err)
	require.Equal(t, deletion.StageRetentionPending, out.Stage)
}

// An executor run without the media store the inventory listed (buzz-admin
// started without BUZZ_MEDIA_*) blocks on record instead of finishing with
// every media object left behind, and so does one run with a store an
// inventory taken without one never counted. Nothing is fenced meanwhile.
// Mutation killed: runStage without the media-store check (the run without
// a store reaches retention_pending and the upload record survives).
func TestExecutorRefusesAMediaStoreOtherThanTheInventorys(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	store, err := media.NewFSStore(t.TempDir())
	require.NoError(t, err)
	svc := media.NewService(store, media.Limits{MaxBytes: 1 << 20, AllowedTypes: []string{"text/plain"}, TempDir: t.TempDir()}, nil)
	listed := f.community("listed-media.test")
	upload(t, svc, listed, "kept until a run with the store")
	for _, tc := range []struct {
		host               string
		inventory, running media.Store
		want               string
	}{
		{"listed-media.test", store, nil, `the approved inventory was taken with media store "listed", this executor has "none"`},
		{"unlisted-media.test", nil, store, `the approved inventory was taken with media store "none", this executor has "listed"`},
	} {
		if tc.host != "listed-media.test" {
			f.community(tc.host)
		}
		req := f.submitAndApprove(tc.host, tc.inventory)
		out, err := deletion.NewExecutor(deletion.Options{Pool: f.pool, Store: tc.running, Config: testConfig()}).Run(f.ctx, req.ID)
		require.NoError(t, err)
		require.NotNil(t, out.BlockedReason, tc.host)
		require.Contains(t, *out.BlockedReason, tc.want)
		require.Equal(t, deletion.StageApproved, out.Stage, "nothing was fenced")
	}
	var records int
	require.NoError(t, store.Walk(f.ctx, "_uploads/"+listed.String()+"/", "", func(string, int64) error { records++; return nil }))
	require.Equal(t, 1, records, "the upload record is still there to delete")
}

// The requester cannot approve their own deletion, however they type their
// name; a second person can. Mutation killed: the approval function
// without its requester check (the self-approval is taken).
func TestRequesterCannotApproveTheirOwnDeletion(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.community("self-approved.test")
	req, err := deletion.Submit(f.ctx, f.pool, nil, "self-approved.test", "ops@example", "")
	require.NoError(t, err)
	_, err = deletion.Approve(f.ctx, f.pool, req.ID, " OPS@example ", "")
	require.ErrorIs(t, err, dberr.ErrDeletionSafety)
	require.ErrorContains(t, err, "who requested it; a second person approves")
	approved, err := deletion.Approve(f.ctx, f.pool, req.ID, "lead@example", "")
	require.NoError(t, err)
	require.Equal(t, deletion.StageApproved, approved.Stage)
}

// An approval that cannot be taken says what to do: a mistyped id is named
// as missing, a blocked request asks to be unblocked first. Mutation
// killed: Approve without those checks ("not found: no rows in result set",
// and the database's "is not waiting for approval").
func TestApproveTellsTheOperatorWhy(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.community("approve-why.test")
	missing := uuid.New()
	_, err := deletion.Approve(f.ctx, f.pool, missing, "lead@example", "")
	require.EqualError(t, err, "no deletion request "+missing.String())
	req, err := deletion.Submit(f.ctx, f.pool, nil, "approve-why.test", "ops@example", "")
	require.NoError(t, err)
	_, err = f.pool.Exec(f.ctx, `UPDATE community_deletion_requests SET blocked_at = now(), blocked_reason = 'redis down' WHERE id = $1`, req.ID)
	require.NoError(t, err)
	_, err = deletion.Approve(f.ctx, f.pool, req.ID, "lead@example", "")
	require.ErrorIs(t, err, dberr.ErrDeletionSafety)
	require.ErrorContains(t, err, "is blocked (redis down)")
	require.ErrorContains(t, err, "deletions unblock")
}

// The same rule holds for a psql session that skips the approval function:
// it inserts the requester's approval row itself and moves the stage.
// Mutation killed: migration 029 without its trigger (the row is taken, the
// request reaches 'approved' and an executor could claim it).
func TestRequesterCannotApproveTheirOwnDeletionByHand(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.community("self-approved-by-hand.test")
	req, err := deletion.Submit(f.ctx, f.pool, nil, "self-approved-by-hand.test", "ops@example", "")
	require.NoError(t, err)
	conn := f.plainConn()
	_, err = conn.Exec(f.ctx, `INSERT INTO community_deletion_approvals (request_id, community_id, inventory_digest, approved_by)
		SELECT id, community_id, inventory_digest, ' Ops@Example' FROM community_deletion_requests WHERE id = $1`, req.ID)
	require.ErrorContains(t, err, "who requested it; a second person approves")
	_, err = conn.Exec(f.ctx, `UPDATE community_deletion_requests SET stage = 'approved' WHERE id = $1`, req.ID)
	require.ErrorContains(t, err, "no approval of this exact inventory")
	row, err := f.q.DeletionRequestGet(f.ctx, req.ID)
	require.NoError(t, err)
	require.Equal(t, deletion.StageInventoried, row.Stage)
}
