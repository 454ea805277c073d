package ingest_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// listClock is a pipeline whose clock the test sets, recording every
// relay-signed list of kind it publishes, in order.
type listClock struct {
	now   atomic.Int64
	mu    sync.Mutex
	lists []*nostr.Event
}

func (f *fixture) listClock(kind int, start int64, maxFutureSkew time.Duration) *listClock {
	c := &listClock{}
	c.now.Store(start)
	f.p = ingest.New(f.pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: maxFutureSkew, Clock: clock.Stub(func() time.Time { return time.Unix(c.now.Load(), 0) })})
	f.p.OnPublish = func(_ uuid.UUID, ev *nostr.Event, _ *uuid.UUID, _ int64) {
		if ev.Kind == kind {
			c.mu.Lock()
			c.lists = append(c.lists, ev)
			c.mu.Unlock()
		}
	}
	return c
}

// requireOneList asserts that a REQ for the channel's list of kind returns
// exactly one event, dated wantCreatedAt and naming wantMembers pubkeys.
func (f *fixture) requireOneList(ch string, kind int, wantCreatedAt int64, wantMembers int) {
	f.t.Helper()
	store := eventstore.New(f.pool, 100)
	var got []*nostr.Event
	require.NoError(f.t, store.QueryJSON(f.ctx, f.tenant.ID(), eventstore.Scope{Channels: []uuid.UUID{uuid.MustParse(ch)}},
		nostr.Filters{{Kinds: []int{kind}, Tags: map[string][]string{"d": {ch}}}}, func(raw []byte, _ *uuid.UUID) error {
			ev, err := nostr.ParseEvent(raw, nostr.Limits{})
			got = append(got, ev)
			return err
		}))
	require.Len(f.t, got, 1, "kind %d", kind)
	require.Equal(f.t, wantCreatedAt, got[0].CreatedAt, "kind %d", kind)
	require.Len(f.t, got[0].Tags.Values("p"), wantMembers, "kind %d", kind)
}

// TestRelaySignedListsAdvanceOneSecondPerVersion toggles a user's
// membership ten times within one second of the pipeline's clock: each new
// members list is dated one second after the one it replaces, so a client
// that kept every list it was sent live and applies NIP-01 (newest
// created_at, then lowest id) keeps the current one, and a REQ returns
// exactly that one. Once the clock passes the lists' dates, the next list
// carries the clock's second again. Mutations killed: dating every list
// with the clock's second (the client keeps whichever list of that second
// has the lowest id: 2 members where the current list has 1); dating every
// list one second after the previous even when the clock is later (the
// list after the pause is dated in the past).
func TestRelaySignedListsAdvanceOneSecondPerVersion(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "relay-clock.example", 0)
	start := time.Now().Unix()
	c := f.listClock(ingest.KindGroupMembers, start, time.Minute)
	owner, user := f.key(), f.key()
	ch := f.channel(owner, false)
	for i := 0; i < 10; i++ {
		kind, members := ingest.KindJoinRequest, 2
		if i%2 == 1 {
			kind, members = ingest.KindLeaveRequest, 1
		}
		f.store(f.sign(user, kind, "", nostr.Tags{{"h", ch}}, start-int64(20-i)))
		// The channel's creation published the first list, dated start.
		f.requireOneList(ch, ingest.KindGroupMembers, start+int64(i)+1, members)
	}
	f.requireOneList(ch, ingest.KindGroupAdmins, start+10, 1)
	kept := c.lists[0]
	for _, l := range c.lists[1:] {
		if l.CreatedAt > kept.CreatedAt || (l.CreatedAt == kept.CreatedAt && l.ID < kept.ID) {
			kept = l
		}
	}
	current := c.lists[len(c.lists)-1]
	require.Equal(t, current.ID, kept.ID, "a NIP-01 client keeps a list of %d members; the current one has %d",
		len(kept.Tags.Values("p")), len(current.Tags.Values("p")))

	c.now.Store(start + 30)
	f.store(f.sign(user, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, start))
	f.requireOneList(ch, ingest.KindGroupMembers, start+30, 2)
}

// Changes sustained faster than one a second advance a list at most the
// future limit ahead of the clock (what the relay accepts from a client);
// there the lists share a second again, and the stored one is still the
// newest. Mutation killed: no limit (the tenth list is dated 10 s ahead
// with a 3 s limit, and under sustained toggling it would run away).
func TestRelaySignedListsStopAtTheFutureLimit(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "relay-clock-limit.example", 0)
	start := time.Now().Unix()
	f.listClock(ingest.KindGroupMembers, start, 3*time.Second)
	owner, user := f.key(), f.key()
	ch := f.channel(owner, false)
	for i := 0; i < 10; i++ {
		kind, members := ingest.KindJoinRequest, 2
		if i%2 == 1 {
			kind, members = ingest.KindLeaveRequest, 1
		}
		f.store(f.sign(user, kind, "", nostr.Tags{{"h", ch}}, start-int64(20-i)))
		f.requireOneList(ch, ingest.KindGroupMembers, start+min(int64(i)+1, 3), members)
	}
	require.Zero(t, f.count(`SELECT count(*) FROM events WHERE kind = ANY($1::int[]) AND created_at > to_timestamp($2)`, ingest.RelayOnlyKinds, start+3),
		"no relay-signed event is dated past the future limit")
	require.Equal(t, 1, f.count(`SELECT count(*) FROM events WHERE kind = $1`, ingest.KindGroupMembers))
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

// A member who joins, leaves and joins again within one second of the
// relay's clock gets three notices, each dated one second after the one
// before: the last says "added", as the member is. Mutation killed:
// dating notices by the clock's second alone (the third notice is then the
// first one again, dropped as a duplicate, and the two stored tie, so the
// member's notices end in whichever a client picks, "removed" by NIP-01's
// lowest id as often as not).
func TestMemberNoticesOfOneSecondAreDatedInTurn(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "member-notices.example", 0)
	start := time.Now().Unix()
	c := f.listClock(ingest.KindMemberAdded, start, time.Minute)
	owner, user := f.key(), f.key()
	ch := f.channel(owner, false)
	for i, kind := range []int{ingest.KindJoinRequest, ingest.KindLeaveRequest, ingest.KindJoinRequest} {
		f.store(f.sign(user, kind, "", nostr.Tags{{"h", ch}}, start-int64(10-i)))
	}
	rows, err := f.pool.Query(f.ctx, `SELECT kind, extract(epoch FROM created_at)::bigint FROM events
		WHERE kind IN ($1, $2) AND tag_index && ARRAY['p:' || $3] ORDER BY created_at`,
		ingest.KindMemberAdded, ingest.KindMemberRemoved, user.PublicKeyHex())
	require.NoError(t, err)
	type notice struct {
		Kind      int
		CreatedAt int64
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[notice])
	require.NoError(t, err)
	require.Equal(t, []notice{
		{ingest.KindMemberAdded, start}, {ingest.KindMemberRemoved, start + 1}, {ingest.KindMemberAdded, start + 2},
	}, got)
	c.mu.Lock()
	require.Len(t, c.lists, 2, "both added notices went out live")
	c.mu.Unlock()

	// Once the clock passes the notices' dates, the next is dated by it.
	c.now.Store(start + 30)
	f.store(f.sign(user, ingest.KindLeaveRequest, "", nostr.Tags{{"h", ch}}, start))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM events WHERE kind = $1 AND created_at = to_timestamp($2)`, ingest.KindMemberRemoved, start+30))
}
