package deletion_test

import (
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/deletion"
	"github.com/buzzrelay/buzz/internal/media"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

type fixture struct {
	t    *testing.T
	ctx  context.Context
	pool *pgxpool.Pool
	q    *db.Queries
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool := dbtest.Pool(t)
	return &fixture{t: t, ctx: context.Background(), pool: pool, q: db.New(pool)}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func (f *fixture) community(host string) uuid.UUID {
	f.t.Helper()
	row, err := f.q.CommunityCreate(f.ctx, host)
	require.NoError(f.t, err)
	return row.ID
}

// seedRows writes one row into several community-scoped tables; the ids
// are the caller's, so two communities can share channel and event ids.
func seedRows(ctx context.Context, conn interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, community, channel uuid.UUID, eventID, pubkey []byte) error {
	stmts := []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO users (community_id, pubkey, display_name) VALUES ($1, $2, 'someone')`, []any{community, pubkey}},
		{`INSERT INTO channels (community_id, id, name, created_by) VALUES ($1, $2, 'general', $3)`, []any{community, channel, pubkey}},
		{`INSERT INTO channel_members (community_id, channel_id, pubkey, role) VALUES ($1, $2, $3, 'owner')`, []any{community, channel, pubkey}},
		{`INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig, channel_id)
		  VALUES ($1, $2, $3, '2026-01-02T03:04:05Z', 9, '[]', 'hello', $4, $5)`, []any{community, eventID, pubkey, randomBytes(64), channel}},
		{`INSERT INTO event_mentions (community_id, pubkey_hex, event_id, event_created_at, channel_id, event_kind)
		  VALUES ($1, encode($2::bytea, 'hex'), $3, '2026-01-02T03:04:05Z', $4, 9)`, []any{community, pubkey, eventID, channel}},
		{`INSERT INTO http_auth_replays (community_id, event_id, expires_at) VALUES ($1, $2, now() + interval '1 hour')`, []any{community, eventID}},
	}
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s.sql, s.args...); err != nil {
			return err
		}
	}
	return nil
}

// insertUser writes one row of the community through a plain session.
func insertUser(ctx context.Context, conn interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, community uuid.UUID) error {
	_, err := conn.Exec(ctx, `INSERT INTO users (community_id, pubkey) VALUES ($1, $2)`, community, randomBytes(32))
	return err
}

func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// submitAndApprove opens and approves the deletion of host.
func (f *fixture) submitAndApprove(host string, store media.Store) db.CommunityDeletionRequest {
	f.t.Helper()
	req, err := deletion.Submit(f.ctx, f.pool, store, host, "ops@example", "test")
	require.NoError(f.t, err)
	require.Equal(f.t, deletion.StageInventoried, req.Stage)
	req, err = deletion.Approve(f.ctx, f.pool, req.ID, "lead@example", "approved in test")
	require.NoError(f.t, err)
	require.Equal(f.t, deletion.StageApproved, req.Stage)
	return req
}

// claim takes the request's lease as owner, without an executor running.
func (f *fixture) claim(id uuid.UUID, owner string, lease time.Duration) db.CommunityDeletionRequest {
	f.t.Helper()
	row, err := f.q.DeletionRequestClaim(f.ctx, db.DeletionRequestClaimParams{ID: &id, Owner: owner, LeaseSeconds: lease.Seconds()})
	require.NoError(f.t, err)
	return row
}

// fence takes host's community to the fenced state through the SQL
// functions the executor uses, and returns the claimed request.
func (f *fixture) fence(host string) db.CommunityDeletionRequest {
	f.t.Helper()
	req := f.submitAndApprove(host, nil)
	row := f.claim(req.ID, "tester", time.Hour)
	require.NoError(f.t, f.q.DeletionRequestBeginQuiescing(f.ctx, db.DeletionRequestBeginQuiescingParams{ID: row.ID, Owner: "tester", Generation: row.LeaseGeneration}))
	gen, err := f.q.DeletionRequestFence(f.ctx, db.DeletionRequestFenceParams{ID: row.ID, Owner: "tester", Generation: row.LeaseGeneration})
	require.NoError(f.t, err)
	require.EqualValues(f.t, 1, gen)
	return row
}

func (f *fixture) plainConn() *pgx.Conn {
	f.t.Helper()
	conn, err := pgx.Connect(f.ctx, f.pool.Config().ConnString())
	require.NoError(f.t, err)
	f.t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// eventually polls cond until it holds or a generous deadline passes.
func eventually(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
