package ingest_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// TestRelaySignedListsNeverRunAheadOfTheClock toggles a user's membership
// twenty times within one second of the pipeline's clock: every relay-signed
// list carries that second, never a later one, and a REQ for each list's slot
// returns exactly one event, the one describing the final membership. One
// second later the next change is dated one second later. Mutation killed:
// dating each list one second after the previous (the lists ran 40 s ahead
// after 20 toggles, and past the future limit under sustained toggling).
func TestRelaySignedListsNeverRunAheadOfTheClock(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "relay-clock.example", 0)
	start := time.Unix(time.Now().Unix(), 0)
	var now atomic.Int64
	now.Store(start.Unix())
	f.p = ingest.New(f.pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: time.Minute, Clock: clock.Stub(func() time.Time { return time.Unix(now.Load(), 0) })})

	owner, user := f.key(), f.key()
	ch := f.channel(owner, false)
	requireOneList := func(kind int, wantCreatedAt int64, wantMembers int) {
		t.Helper()
		store := eventstore.New(f.pool, 100)
		var got []*nostr.Event
		require.NoError(t, store.QueryJSON(f.ctx, f.tenant.ID(), eventstore.Scope{Channels: []uuid.UUID{uuid.MustParse(ch)}},
			nostr.Filters{{Kinds: []int{kind}, Tags: map[string][]string{"d": {ch}}}}, func(raw []byte, _ *uuid.UUID) error {
				ev, err := nostr.ParseEvent(raw, nostr.Limits{})
				got = append(got, ev)
				return err
			}))
		require.Len(t, got, 1, "kind %d", kind)
		require.Equal(t, wantCreatedAt, got[0].CreatedAt, "kind %d", kind)
		require.Len(t, got[0].Tags.Values("p"), wantMembers, "kind %d", kind)
	}
	// After every toggle the one stored members list is the current one.
	for i := 0; i < 20; i++ {
		kind, members := ingest.KindJoinRequest, 2
		if i%2 == 1 {
			kind, members = ingest.KindLeaveRequest, 1
		}
		f.store(f.sign(user, kind, "", nostr.Tags{{"h", ch}}, start.Unix()-int64(20-i)))
		requireOneList(ingest.KindGroupMembers, start.Unix(), members)
	}
	requireOneList(ingest.KindGroupMembers, start.Unix(), 1)
	requireOneList(ingest.KindGroupAdmins, start.Unix(), 1)
	require.Zero(t, f.count(`SELECT count(*) FROM events WHERE kind = ANY($1::int[]) AND created_at > $2`, ingest.RelayOnlyKinds, start),
		"no relay-signed event is dated after the clock")
	require.Equal(t, 1, f.count(`SELECT count(*) FROM events WHERE kind = $1`, ingest.KindGroupMembers))

	now.Add(1)
	f.store(f.sign(user, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, start.Unix()))
	requireOneList(ingest.KindGroupMembers, start.Unix()+1, 2)
}

// The relay's channel lists and membership notices p-tag members as data,
// not to wake them: joining a channel stores a members list (39002) naming
// every member and a notice (44100) naming the new one, and neither writes
// a mention row. Only EmitWaking (a workflow's doorbell) wakes. Mutation
// killed: Emit writing the waking side rows gives the list's members
// mention rows, which for a large channel means thousands per change.
func TestRelayListsAndNoticesWakeNobody(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "relay-nowake.example", 0)
	owner, user := f.key(), f.key()
	ch := f.channel(owner, false)
	f.store(f.sign(user, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM events WHERE kind = $1 AND tag_index && ARRAY['p:' || $2]`, ingest.KindGroupMembers, user.PublicKeyHex()))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM events WHERE kind = $1 AND tag_index && ARRAY['p:' || $2]`, ingest.KindMemberAdded, user.PublicKeyHex()))
	require.Zero(t, f.count(`SELECT count(*) FROM event_mentions`))
}
