package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// heldInsert holds the insert of ev (stored in channel) in a transaction of
// the test's own: a write of ev waits for it, past its authorization and
// before its commit, until release. waiting counts the other sessions of
// the database waiting for a lock.
func heldInsert(t *testing.T, pool *pgxpool.Pool, community uuid.UUID, ev *nostr.Event, channel uuid.UUID) (release func(), waiting func() int) {
	t.Helper()
	ctx := context.Background()
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	released := false
	release = func() {
		if !released {
			released = true
			require.NoError(t, holder.Rollback(ctx))
		}
	}
	t.Cleanup(release)
	params, err := eventstore.InsertParams(community, ev, &channel)
	require.NoError(t, err)
	_, err = db.New(holder).EventInsert(ctx, params)
	require.NoError(t, err)
	var holderPID int
	require.NoError(t, holder.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&holderPID))
	waiting = func() (n int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> $1`, holderPID).Scan(&n))
		return n
	}
	return release, waiting
}

// publishAsync sends ev from c and returns where its OK will arrive.
func publishAsync(c *relaytest.Client, ev *nostr.Event) <-chan relaytest.Reply {
	got := make(chan relaytest.Reply, 1)
	go func() { got <- c.Publish(ev) }()
	return got
}

// untilAnsweredOrWaiting waits until answer arrives (true) or the database
// has want sessions waiting for a lock (false).
func untilAnsweredOrWaiting(t *testing.T, answer <-chan relaytest.Reply, waiting func() int, want int) (relaytest.Reply, bool) {
	t.Helper()
	var got relaytest.Reply
	var answered bool
	require.Eventually(t, func() bool {
		select {
		case got = <-answer:
			answered = true
			return true
		default:
			return waiting() == want
		}
	}, 30*time.Second, 5*time.Millisecond, "the write neither committed nor waits")
	return got, answered
}

// A message in flight when a member is removed: its write has read the
// channel's access row (and so its readers version) but not committed yet
// when the removal commits through another relay process. Both run for
// real: the message's insert is held, the removal is sent meanwhile, then
// the message is let through. Whatever order the two end in, the removed
// member must not receive an event committed after its removal: if the
// removal commits while the message is held, the message comes after it
// and must not reach the removed member on B (whose reader set, cached
// before the removal, is as new as the version the message read; the
// invalidation is held back in Redis); if the removal waits for the
// message instead, the message is committed before it and may reach them.
// Mutation killed: ChannelAccess without its write lock (the removal
// commits while the message is held, and B delivers the message, committed
// after the removal, to the removed member).
func TestRemovalRacingAMessageInFlightHoldsAcrossRelays(t *testing.T) {
	t.Parallel()
	redis, a, b, owner, ch, leaving, staying := privateChannelOnTwoRelays(t)
	// B caches the channel's readers while delivering this.
	postOnB(t, staying, leaving, ch, "before")

	holdRedisWrites(t, redis)

	inFlight := staying.Sign(9, "in flight", nostr.Tags{{"h", ch}}, 0)
	release, waiting := heldInsert(t, a.Pool, a.CommunityID, inFlight, uuid.MustParse(ch))
	staying.Send("EVENT", inFlight)
	require.Eventually(t, func() bool { return waiting() == 1 }, 30*time.Second, 5*time.Millisecond, "the message's write does not wait for the held row")

	removal := publishAsync(owner, owner.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", leaving.Key.PublicKeyHex()}}, 0))
	got, removedFirst := untilAnsweredOrWaiting(t, removal, waiting, 2)
	release()

	require.Equal(t, inFlight.ID, staying.Expect("EVENT").Event.ID, "a member still receives the channel")
	require.True(t, staying.Expect("OK").OK)
	if !removedFirst {
		got = <-removal
		require.True(t, got.OK, got.Msg)
		return // the message committed before the removal: the removed member may have it
	}
	require.True(t, got.OK, got.Msg)
	require.Equal(t, "connected", readyRedis(t, b), "B still trusts its cache: the window this test is about")
	// B fanned the message out before answering its author, and a
	// connection's frames leave in order: the removed member's answer to a
	// REQ sent now comes after any delivery of it.
	leaving.Send("REQ", "probe", map[string]any{"ids": []string{strings.Repeat("0", 64)}})
	require.Equal(t, "EOSE", leaving.NextReply().Verb, "a member removed through A must not receive, on B, a message committed after the removal")
}

// The removed member's own message racing its removal: the removal has
// taken the channel's lock and is held before its commit when the
// message arrives. The message must either commit before the removal or
// be refused; it must never be stored after the removal on the strength of
// a membership read before it committed.
// Mutation killed: the check's read before its write lock (the read sees
// the membership the removal in flight has not committed away yet: the
// message is stored, after the removal, as the removed member's).
func TestRemovedMembersMessageRacingItsRemovalIsNotStoredAfterIt(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, r.Host)
	owner.Auth(nil)
	ch := createChannel(t, owner, "secret", true)
	leaving := r.Dial(t, r.Host)
	leaving.Auth(nil)
	require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", leaving.Key.PublicKeyHex()}}, 0)).OK)
	require.True(t, leaving.Publish(leaving.Sign(9, "while a member", nostr.Tags{{"h", ch}}, 0)).OK)

	removalEvent := owner.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", leaving.Key.PublicKeyHex()}}, 0)
	release, waiting := heldInsert(t, r.Pool, r.CommunityID, removalEvent, uuid.MustParse(ch))
	removal := publishAsync(owner, removalEvent)
	require.Eventually(t, func() bool { return waiting() == 1 }, 30*time.Second, 5*time.Millisecond, "the removal does not wait for the held row")

	message := leaving.Sign(9, "racing my removal", nostr.Tags{{"h", ch}}, 0)
	answer := publishAsync(leaving, message)
	got, answered := untilAnsweredOrWaiting(t, answer, waiting, 2)
	release()
	removed := <-removal
	require.True(t, removed.OK, removed.Msg)
	if answered {
		require.True(t, got.OK, "a message answered before the removal commits is its member's: %s", got.Msg)
		return
	}
	got = <-answer
	requireRejected(t, got, "restricted:")
	require.Empty(t, owner.Req("stored", map[string]any{"ids": []string{message.ID}}), "a message refused is not stored")
}

// An open channel turned private through A, while a non-member follows it
// on B and B has not heard A's invalidation (held back in Redis): the next
// message written on B read the version the change wrote, so B reads the
// channel's readers again, and the outsider neither receives it nor reads
// the channel's history any more. A guard for an attack that held.
func TestChannelTurnedPrivateStopsAnOutsiderOnAnotherRelayAtOnce(t *testing.T) {
	t.Parallel()
	redis := dbtest.RedisServer(t)
	pool := dbtest.Pool(t)
	a := relaytest.StartOn(t, pool, withRedis(redis.URL()))
	b := relaytest.StartOn(t, pool, withRedis(redis.URL()))
	waitRedis(t, "connected", a, b)
	owner := a.Dial(t, a.Host)
	owner.Auth(nil)
	ch := createChannel(t, owner, "soon secret", false)
	member := b.Dial(t, a.Host)
	member.Auth(nil)
	require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", member.Key.PublicKeyHex()}}, 0)).OK)
	outsider := b.Dial(t, a.Host)
	outsider.Auth(nil)
	for _, c := range []*relaytest.Client{member, outsider} {
		c.Send("REQ", "channel", map[string]any{"kinds": []int{9}, "#h": []string{ch}, "limit": 0})
		c.Expect("EOSE")
	}
	postOnB(t, member, outsider, ch, "while open")

	holdRedisWrites(t, redis)
	got := owner.Publish(owner.Sign(9002, "", nostr.Tags{{"h", ch}, {"private"}}, 0))
	require.True(t, got.OK, got.Msg)
	postOnB(t, member, nil, ch, "now private")
	require.Equal(t, "connected", readyRedis(t, b), "B still trusts its cache: the window this test is about")
	outsider.Send("REQ", "history", map[string]any{"#h": []string{ch}})
	require.Equal(t, "restricted: not a channel member", outsider.Expect("CLOSED").Msg)
	outsider.ExpectSilence(300*time.Millisecond, "a channel turned private through A must not reach an outsider on B")
}
