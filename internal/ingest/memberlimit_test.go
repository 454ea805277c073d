package ingest_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// memberLimitFixture is a fixture whose pipeline caps channels at
// maxMembers, counting the refusals it reports.
func memberLimitFixture(t *testing.T, host string, maxMembers int) (*fixture, *atomic.Int64) {
	f := newFixture(t, host, 0)
	f.p = ingest.New(f.pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: time.Minute, MaxChannelMembers: maxMembers})
	var refusals atomic.Int64
	f.p.OnMemberLimit = func() { refusals.Add(1) }
	return f, &refusals
}

// refusedAtLimit submits ev, which would add a member to a full channel,
// and requires the member-limit refusal with nothing of the event written:
// not the event (rejected checks that), no membership row of target, no
// 44100 notice, no new members list.
func (f *fixture) refusedAtLimit(ev *nostr.Event, ch string, target string, limit int) {
	f.t.Helper()
	lists := f.count(`SELECT count(*) FROM events WHERE kind = $1`, ingest.KindGroupMembers)
	notices := f.count(`SELECT count(*) FROM events WHERE kind = $1`, ingest.KindMemberAdded)
	f.rejected(ev, fmt.Sprintf("restricted: the channel has reached its member limit (%d)", limit))
	require.Zero(f.t, f.count(`SELECT count(*) FROM channel_members WHERE channel_id = $1::uuid AND pubkey = decode($2, 'hex') AND removed_at IS NULL`, ch, target))
	require.Equal(f.t, lists, f.count(`SELECT count(*) FROM events WHERE kind = $1`, ingest.KindGroupMembers), "no members list written")
	require.Equal(f.t, notices, f.count(`SELECT count(*) FROM events WHERE kind = $1`, ingest.KindMemberAdded), "no 44100 written")
}

// TestMemberLimitRefusesEveryAdd: at the limit, each path that adds a
// member (a join, an owner's put-user, a removed member's return by either)
// is refused with restricted: and writes nothing; a member already in
// the channel is never refused (a role change, a second join), and a
// removal makes room again. Mutations killed: the upsert without its count
// (every add stored); the count without its active-member exception (the
// role change and the second join refused).
func TestMemberLimitRefusesEveryAdd(t *testing.T) {
	t.Parallel()
	const limit = 3
	f, refusals := memberLimitFixture(t, "member-limit.example", limit)
	owner, alice, bob, carol, dave := f.key(), f.key(), f.key(), f.key(), f.key()
	ch := f.channel(owner, false) // 1: the creator
	f.store(f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", ch}, {"p", alice.PublicKeyHex()}}, 0))
	f.store(f.sign(bob, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0))
	require.Len(t, f.activeMembers(ch), limit)

	f.refusedAtLimit(f.sign(carol, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0), ch, carol.PublicKeyHex(), limit)
	f.refusedAtLimit(f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", ch}, {"p", dave.PublicKeyHex()}}, 0), ch, dave.PublicKeyHex(), limit)
	f.refusedAtLimit(f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", ch}, {"p", dave.PublicKeyHex(), "admin"}}, 0), ch, dave.PublicKeyHex(), limit)
	require.EqualValues(t, 3, refusals.Load())

	// Members already in: a role change and a second join are no adds.
	f.store(f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", ch}, {"p", alice.PublicKeyHex(), "admin"}}, 0))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM channel_members WHERE pubkey = decode($1, 'hex') AND role = 'admin'`, alice.PublicKeyHex()))
	f.store(f.sign(bob, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}, {"again", "yes"}}, 0))

	// A removal makes room for one, and the removed member's return is an
	// add like any other: refused once the room is taken.
	f.store(f.sign(owner, ingest.KindRemoveUser, "", nostr.Tags{{"h", ch}, {"p", bob.PublicKeyHex()}}, 0))
	f.store(f.sign(carol, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}, {"second", "try"}}, 0))
	f.refusedAtLimit(f.sign(bob, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}, {"back", "again"}}, 0), ch, bob.PublicKeyHex(), limit)
	f.refusedAtLimit(f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", ch}, {"p", bob.PublicKeyHex()}}, 0), ch, bob.PublicKeyHex(), limit)
	require.Len(t, f.activeMembers(ch), limit)
	require.EqualValues(t, 5, refusals.Load())

	// Leaving makes room too.
	f.store(f.sign(carol, ingest.KindLeaveRequest, "", nostr.Tags{{"h", ch}}, 0))
	f.store(f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", ch}, {"p", bob.PublicKeyHex()}, {"third", "try"}}, 0))
	require.Len(t, f.activeMembers(ch), limit)
}

// TestMemberLimitCountsEachChannel: the limit is per channel; a new
// channel's creator is its first member even when the limit is one, and
// the next add to it is refused.
func TestMemberLimitCountsEachChannel(t *testing.T) {
	t.Parallel()
	f, _ := memberLimitFixture(t, "member-limit-one.example", 1)
	owner, other := f.key(), f.key()
	first := f.channel(owner, false)
	second := f.channel(owner, false)
	require.Len(t, f.activeMembers(first), 1)
	require.Len(t, f.activeMembers(second), 1)
	f.refusedAtLimit(f.sign(other, ingest.KindJoinRequest, "", nostr.Tags{{"h", second}}, 0), second, other.PublicKeyHex(), 1)
	// The creator's own join is no add.
	f.store(f.sign(owner, ingest.KindJoinRequest, "", nostr.Tags{{"h", first}}, 0))
}

// TestConcurrentAddsAtLimitMinusOneAddOne: a channel one member short of
// its limit gets joins and put-users of distinct members at once from
// several relay processes (each its own pool and pipeline, so each event
// is its own transaction on its own connection). The channel's row lock,
// which every add takes before it counts, lets exactly one in; the others
// are refused with the limit. Rounds repeat the race, each after a removal
// that puts the channel one short again. Mutation killed: the join and
// put-user paths counting without the row lock (lockChannel not taking
// ChannelLockForChange): two adds count the same members and both insert,
// then deadlock asking the write lock exclusive for their lists while each
// holds it shared, and the one PostgreSQL ends is answered "error: the
// write collided with a concurrent one" (run: round 1).
func TestConcurrentAddsAtLimitMinusOneAddOne(t *testing.T) {
	t.Parallel()
	const limit, processes = 4, 6
	f := newFixture(t, "member-limit-race.example", 4)
	opts := ingest.Options{MaxFutureSkew: 10 * time.Minute, MaxChannelMembers: limit}
	procs := make([]*foldProcess, processes)
	for i := range procs {
		procs[i] = f.foldProcessWith(opts)
	}
	f.p = procs[0].p
	owner := f.key()
	ch := f.channel(owner, false)
	for range limit - 2 {
		f.store(f.sign(f.key(), ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0))
	}
	for round := range 10 {
		require.Len(t, f.activeMembers(ch), limit-1, "round %d starts one short", round)
		adds := make([]*nostr.Event, processes)
		for i := range adds {
			k := f.key()
			if i%2 == 0 {
				adds[i] = f.sign(k, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0)
			} else {
				adds[i] = f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", ch}, {"p", k.PublicKeyHex()}}, 0)
			}
		}
		start := make(chan struct{})
		errs := make([]error, processes)
		var wg sync.WaitGroup
		for i, ev := range adds {
			wg.Go(func() {
				<-start
				_, errs[i] = procs[i].p.Submit(f.ctx, f.tenant, ev.PubKey, ev)
			})
		}
		close(start)
		wg.Wait()
		added, stored := -1, 0
		for i, err := range errs {
			if err == nil {
				added, stored = i, stored+1
			}
		}
		require.Equal(t, 1, stored, "round %d: exactly one add passes: %v", round, errs)
		for i, err := range errs {
			require.True(t, i == added || ingest.IsMemberLimit(err), "round %d: %v", round, err)
		}
		require.Len(t, f.activeMembers(ch), limit, "round %d", round)
		member := adds[added].PubKey
		if adds[added].Kind == ingest.KindPutUser {
			member = adds[added].Tags.First("p")[1]
		}
		f.store(f.sign(owner, ingest.KindRemoveUser, "", nostr.Tags{{"h", ch}, {"p", member}}, 0))
	}
}
