package ingest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// The times the write spine records come from the pipeline's clock, not
// from the database's: a stubbed clock an hour ahead dates a removal, a
// metadata edit, a profile update and a channel deletion. Mutation killed:
// any of these queries using bare now() (or ignoring its now parameter).
func TestWriteSpineRecordsTimeFromTheInjectedClock(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "clock.example", 0)
	at := time.Now().Add(time.Hour).Truncate(time.Second)
	f.p = ingest.New(f.pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: time.Minute, Clock: clock.Stub(func() time.Time { return at })})
	owner, member := f.key(), f.key()
	ch := f.channel(owner, true)
	f.store(f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}}, 0))
	f.store(f.sign(owner, ingest.KindRemoveUser, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}}, 0))
	f.store(f.sign(owner, ingest.KindEditMetadata, "", nostr.Tags{{"h", ch}, {"name", "renamed"}}, 0))
	f.store(f.sign(member, 0, `{"name":"m"}`, nil, 0))

	stamp := func(sql string) time.Time {
		t.Helper()
		var got time.Time
		require.NoError(t, f.pool.QueryRow(f.ctx, sql).Scan(&got))
		return got
	}
	require.True(t, at.Equal(stamp(`SELECT removed_at FROM channel_members WHERE removed_at IS NOT NULL`)), "removed_at")
	require.True(t, at.Equal(stamp(`SELECT updated_at FROM channels`)), "channels.updated_at")
	require.True(t, at.Equal(stamp(`SELECT updated_at FROM users`)), "users.updated_at")

	f.store(f.sign(owner, ingest.KindDeleteGroup, "", nostr.Tags{{"h", ch}}, 0))
	require.True(t, at.Equal(stamp(`SELECT deleted_at FROM channels`)), "channels.deleted_at")
}
