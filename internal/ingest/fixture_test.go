package ingest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// fixture is one community on its own database with a pipeline over it.
type fixture struct {
	t      *testing.T
	ctx    context.Context
	pool   *pgxpool.Pool
	tenant community.Tenant
	p      *ingest.Pipeline
	base   int64 // a past created_at that tests count up from
	// secondGroupMax is GroupMax of the second pipeline commitAfterBlocked
	// writes through (0: the default).
	secondGroupMax int
}

// newFixture makes a community at host; maxConns > 0 sizes the pool (for
// tests that need real parallelism in PostgreSQL).
func newFixture(t *testing.T, host string, maxConns int32) *fixture {
	t.Helper()
	ctx := context.Background()
	pool := dbtest.PoolOn(t, dbtest.URL(t), maxConns)
	row, err := db.New(pool).CommunityCreate(ctx, host)
	require.NoError(t, err)
	return &fixture{
		t: t, ctx: ctx, pool: pool, tenant: community.FromRow(row),
		p: ingest.New(pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: time.Minute}), base: time.Now().Unix() - 10000,
	}
}

// community adds another community on the same database.
func (f *fixture) community(host string) community.Tenant {
	row, err := db.New(f.pool).CommunityCreate(f.ctx, host)
	require.NoError(f.t, err)
	return community.FromRow(row)
}

func (f *fixture) key() *nostr.SecretKey {
	k, err := nostr.GenerateSecretKey()
	require.NoError(f.t, err)
	return k
}

// sign builds an event; createdAt 0 means now.
func (f *fixture) sign(key *nostr.SecretKey, kind int, content string, tags nostr.Tags, createdAt int64) *nostr.Event {
	f.t.Helper()
	if createdAt == 0 {
		createdAt = time.Now().Unix()
	}
	if tags == nil {
		tags = nostr.Tags{}
	}
	ev := &nostr.Event{Kind: kind, Content: content, Tags: tags, CreatedAt: createdAt}
	require.NoError(f.t, ev.Sign(key))
	return ev
}

func (f *fixture) submit(ev *nostr.Event) (ingest.Outcome, error) {
	return f.p.Submit(f.ctx, f.tenant, ev.PubKey, ev)
}

func (f *fixture) store(ev *nostr.Event) *nostr.Event {
	f.t.Helper()
	out, err := f.submit(ev)
	require.NoError(f.t, err)
	require.Equal(f.t, ingest.Stored, out)
	return ev
}

// rejected submits ev and requires the exact NIP-01 message want; the event
// must not be stored.
func (f *fixture) rejected(ev *nostr.Event, want string) {
	f.t.Helper()
	_, err := f.submit(ev)
	var rej *ingest.Rejection
	require.True(f.t, errors.As(err, &rej), "want rejection %q, got %v", want, err)
	require.Equal(f.t, want, rej.Error())
	require.Zero(f.t, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1`, ev.ID), "a rejected event is not stored")
}

// channel creates a channel owned by key.
func (f *fixture) channel(owner *nostr.SecretKey, private bool) string {
	f.t.Helper()
	id := uuid.NewString()
	tags := nostr.Tags{{"h", id}, {"name", "room " + id[:8]}}
	if private {
		tags = append(tags, nostr.Tag{"visibility", "private"})
	}
	f.store(f.sign(owner, ingest.KindCreateGroup, "", tags, 0))
	return id
}

func (f *fixture) count(sql string, args ...any) int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.pool.QueryRow(f.ctx, sql, args...).Scan(&n))
	return n
}
