package relay_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
	"github.com/buzzrelay/buzz/internal/replica"
)

// contentRows is a pgx tracer that remembers the most rows one statement
// reading events' content returned, and how many such statements ran.
type contentRows struct {
	mu         sync.Mutex
	most       int64
	statements int
}

type contentSQL struct{}

func (c *contentRows) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, contentSQL{}, strings.Contains(d.SQL, "content"))
}

func (c *contentRows) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if readsContent, _ := ctx.Value(contentSQL{}).(bool); readsContent {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.most, c.statements = max(c.most, d.CommandTag.RowsAffected()), c.statements+1
	}
}

// A catch-up after a lost subscription holds a batch of the gap's events
// at a time, not the whole gap: up to 10,000 events of up to 256 KB each,
// read at once, in every relay process at once when Redis returns (or in
// the one Redis disconnected for lagging behind a flood of large events),
// was gigabytes. Counted as the rows of content one statement returns
// (what the process holds at once), not as the heap, which garbage
// collection's pacing moves.
// Mutation killed: reading the gap in one statement (all 300 events'
// content in one answer).
func TestCatchUpHoldsABatchOfTheGapAtATime(t *testing.T) {
	t.Parallel()
	counter := &contentRows{}
	r := relaytest.StartOn(t, dbtest.PoolOn(t, dbtest.URL(t), 0, func(c *pgxpool.Config) { c.ConnConfig.Tracer = counter }))
	subscriber := r.Dial(t, r.Host)
	subscriber.Auth(nil)
	// A live subscription makes the community one to catch up on; it
	// matches none of the gap's events, so only the catch-up holds them.
	subscriber.Send("REQ", "live", map[string]any{"kinds": []int{7}, "limit": 0})
	subscriber.Expect("EOSE")

	const events, size = 300, 1_000
	// Stored straight into the database, as other processes would.
	_, err := r.Pool.Exec(t.Context(), `INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig)
		SELECT $1, sha256(int8send(i) || $2::bytea), '\x`+strings.Repeat("ab", 32)+`', now() - i * interval '1 ms',
		       1, '[]', repeat('x', $3), '\x`+strings.Repeat("cd", 64)+`'
		FROM generate_series(1, $4::int) i`, r.CommunityID, r.CommunityID[:], size, events)
	require.NoError(t, err)

	counter.mu.Lock()
	counter.most, counter.statements = 0, 0
	counter.mu.Unlock()
	now := time.Now()
	replayed, err := r.Server.CatchUp(t.Context(), now.Add(-time.Minute), now)
	require.NoError(t, err)
	require.Equal(t, events, replayed, "every event of the gap is handed on")
	counter.mu.Lock()
	defer counter.mu.Unlock()
	t.Logf("%d statements read the gap's events, at most %d at once", counter.statements, counter.most)
	require.LessOrEqual(t, counter.most, int64(16), "the catch-up read more than a batch of the gap's events at once")
	require.GreaterOrEqual(t, counter.statements, events/16, "the gap is read a batch at a time")
	subscriber.ExpectSilence(100*time.Millisecond, "the subscription matched none of them")
}

// syncReceiver records, on the delivering goroutine, what seen said when
// each event was handed to it.
type syncReceiver struct {
	mu   sync.Mutex
	seen func() time.Time
	at   []time.Time
}

func (r *syncReceiver) Enqueue([]byte) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.at = append(r.at, r.seen())
	return true
}

func (r *syncReceiver) marks() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.at)
}

// A deletion replayed by a catch-up (another process stored it while this
// one heard nothing) marks its channel for the read routing before any
// subscriber here is sent it, as a live one does: a member who receives it
// and reads the channel again at once must find the router told, not be
// routed to a standby that has not replayed the deletion and get the
// message back.
// Mutation killed: the catch-up telling the routing after the replay
// (the subscriber holds the deletion while the channel has no mark).
func TestCatchUpTellsTheRoutingOfADeletionBeforeReplayingIt(t *testing.T) {
	t.Parallel()
	writer := dbtest.URL(t)
	pool := dbtest.PoolOn(t, writer, 0, func(c *pgxpool.Config) { replica.ArmFloor(c, replica.DefaultFloor) })
	r := relaytest.StartOn(t, pool, func(c *config.Config) { c.ReadDatabaseURL = writer }) // any reader turns the routing's marks on
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	channel := uuid.New() // rows only: creating it would publish its lists, which mark it too
	rec := &syncReceiver{seen: func() time.Time { return r.Server.LastRemoval(r.CommunityID, &channel) }}
	r.Server.SubscribeInProcess(r.CommunityID, &fanout.Subscription{Receiver: rec, ID: "deletions", Filters: nostr.Filters{{Kinds: []int{nostr.KindDeletion}}}})

	// Stored straight into the database, as another process would have
	// while this one heard nothing.
	start := time.Now()
	note := relaytest.SignEvent(t, key, 9, "regretted", nostr.Tags{{"h", channel.String()}}, start.Unix())
	deletion := relaytest.SignEvent(t, key, nostr.KindDeletion, "", nostr.Tags{{"e", note.ID}, {"h", channel.String()}}, start.Unix())
	storeOld(t, writer, r.CommunityID, channel.String(), note)
	storeOld(t, writer, r.CommunityID, channel.String(), deletion)

	_, err = r.Server.CatchUp(t.Context(), start.Add(-time.Minute), time.Now())
	require.NoError(t, err)
	marks := rec.marks()
	require.Len(t, marks, 1, "the deletion replayed")
	require.False(t, marks[0].IsZero(), "the routing was told of the deletion before the subscriber was sent it")
}

// A catch-up judges expiration (NIP-40) by the relay's clock, as a REQ
// does: a subscriber here is not sent, as live, an event the same relay's
// REQ no longer returns. Here the relay's clock runs an hour ahead of the
// database's: by it the event has expired, by the database's it has half
// an hour to go.
// Mutation killed: EventKeysReceivedBetween and EventsByKey comparing
// expires_at with the database's now() (the expired event is replayed,
// and replayed counts 2).
func TestCatchUpJudgesExpirationByTheRelaysClock(t *testing.T) {
	t.Parallel()
	stub := clock.Stub(func() time.Time { return time.Now().Add(time.Hour) })
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithClock(stub)})
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	rec := &syncReceiver{seen: time.Now}
	r.Server.SubscribeInProcess(r.CommunityID, &fanout.Subscription{Receiver: rec, ID: "notes", Filters: nostr.Filters{{Kinds: []int{1}}}})

	start := time.Now()
	inHalfAnHour := strconv.FormatInt(start.Add(30*time.Minute).Unix(), 10)
	expiring := relaytest.SignEvent(t, key, 1, "gone by the relay's clock", nostr.Tags{{"expiration", inHalfAnHour}}, start.Unix())
	kept := relaytest.SignEvent(t, key, 1, "lasting", nostr.Tags{}, start.Unix())
	for _, ev := range []*nostr.Event{expiring, kept} {
		params, err := eventstore.InsertParams(r.CommunityID, ev, nil)
		require.NoError(t, err)
		_, err = db.New(r.Pool).EventInsert(t.Context(), params)
		require.NoError(t, err)
	}

	replayed, err := r.Server.CatchUp(t.Context(), start.Add(-time.Minute), time.Now())
	require.NoError(t, err)
	require.Equal(t, 1, replayed, "the event expired by the relay's clock is not replayed")
	require.Len(t, rec.marks(), 1)
}
