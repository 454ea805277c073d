package presence_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
	"weak"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/presence"
)

// The in-process store holds at most its bound: a new pubkey past it is
// refused (ErrFull) unless an expired announcement can be swept to make
// room, and re-announcing an already held pubkey always fits.
// Mutations killed: no bound (the third pubkey is kept); no sweep (the
// pubkey after expiry is refused).
func TestMemoryIsBounded(t *testing.T) {
	t.Parallel()
	m := presence.NewMemory(time.Minute, 2, 1<<20, 1<<20)
	community, channel := uuid.New(), uuid.New()
	now := time.Unix(1_000_000, 0)
	announce := func(pubkey string, at time.Time) error {
		return m.Remember(community, channel, fakeEvent(pubkey, at, 0), at)
	}
	require.NoError(t, announce("a", now))
	require.NoError(t, announce("b", now))
	require.ErrorIs(t, announce("c", now), presence.ErrFull)
	require.Len(t, m.Current(context.Background(), community, channel, now), 2, "the third pubkey is past the bound")
	require.NoError(t, announce("a", now.Add(time.Second)))
	require.Len(t, m.Current(context.Background(), community, channel, now.Add(time.Second)), 2, "re-announcing fits")

	later := now.Add(time.Minute + 30*time.Second) // b expired, a (re-announced) too
	require.NoError(t, announce("c", later))
	got := m.Current(context.Background(), community, channel, later)
	require.Len(t, got, 1)
	require.Equal(t, hexKey("c"), got[0].PubKey, "expired announcements were swept to make room")
}

// The in-process store also holds at most its bytes: an announcement may be
// as large as any event, so a count alone bounds nothing. Bytes are those
// of the event's JSON. Past the bound a new announcement is refused unless
// sweeping expired ones makes room; a re-announcement that no longer fits
// is refused too, and the one it would have replaced stays.
// Mutations killed: no byte bound (the third announcement is kept); the
// replaced announcement's bytes not given back (the re-announcement does
// not fit); no sweep by bytes (the late announcement is refused);
// dropping the held announcement when its refused successor does not fit.
func TestMemoryIsBoundedInBytes(t *testing.T) {
	t.Parallel()
	community, channel := uuid.New(), uuid.New()
	now := time.Unix(1_000_000, 0)
	sized := fakeEvent
	one := len(sized("a", now, 1000).AppendJSON(nil))
	m := presence.NewMemory(time.Minute, 100, 2*one, 1<<20)
	current := func(at time.Time) []string {
		var pubkeys []string
		for _, ev := range m.Current(context.Background(), community, channel, at) {
			pubkeys = append(pubkeys, ev.PubKey[:1])
		}
		return pubkeys
	}
	require.NoError(t, m.Remember(community, channel, sized("a", now, 1000), now))
	require.NoError(t, m.Remember(community, channel, sized("b", now, 1000), now))
	require.ErrorIs(t, m.Remember(community, channel, sized("c", now, 1000), now), presence.ErrFull)
	require.ElementsMatch(t, []string{"a", "b"}, current(now), "the third announcement is past the byte bound")

	next := now.Add(time.Second)
	require.NoError(t, m.Remember(community, channel, sized("a", next, 1000), next))
	require.ElementsMatch(t, []string{"a", "b"}, current(next), "a re-announcement of the same size fits in place of the old one")
	require.ErrorIs(t, m.Remember(community, channel, sized("a", next.Add(time.Second), 5000), next.Add(time.Second)), presence.ErrFull)
	require.ElementsMatch(t, []string{"a", "b"}, current(next.Add(time.Second)), "a refused re-announcement leaves the one it would have replaced")

	later := now.Add(time.Minute + 30*time.Second) // a and b expired
	require.NoError(t, m.Remember(community, channel, sized("c", later, 1500), later))
	require.Equal(t, []string{"c"}, current(later), "expired announcements were swept to make room")
}

// One channel holds at most its own byte bound, which a presence REQ
// parses whole, however much room the store has; another channel is not
// charged for it, and a channel's bytes come back as its announcements
// go. Mutation killed: no per-channel bound (the third announcement in
// the first channel is kept).
func TestMemoryIsBoundedInBytesPerChannel(t *testing.T) {
	t.Parallel()
	community, crowded, quiet := uuid.New(), uuid.New(), uuid.New()
	now := time.Unix(1_000_000, 0)
	one := len(fakeEvent("a", now, 1000).AppendJSON(nil))
	m := presence.NewMemory(time.Minute, 100, 100*one, 2*one)
	in := func(channel uuid.UUID) []string {
		var pubkeys []string
		for _, ev := range m.Current(context.Background(), community, channel, now) {
			pubkeys = append(pubkeys, ev.PubKey[:1])
		}
		return pubkeys
	}
	for _, digit := range []string{"a", "b", "c"} {
		m.Remember(community, crowded, fakeEvent(digit, now, 1000), now)
	}
	require.ElementsMatch(t, []string{"a", "b"}, in(crowded))
	for _, digit := range []string{"a", "b"} {
		m.Remember(community, quiet, fakeEvent(digit, now, 1000), now)
	}
	require.ElementsMatch(t, []string{"a", "b"}, in(quiet), "each channel has its own bound")

	later := now.Add(time.Minute + time.Second)
	m.Remember(community, crowded, fakeEvent("c", later, 1000), later)
	m.Remember(community, crowded, fakeEvent("d", later, 1000), later)
	now = later
	require.ElementsMatch(t, []string{"c", "d"}, in(crowded), "expired announcements gave their bytes back")
}

// hexKey is a well-formed pubkey named by one hex digit.
func hexKey(digit string) string { return strings.Repeat(digit, 64) }

// fakeEvent is a presence event of the right shape (the store hands back
// what it parses), unsigned: the store does not verify.
func fakeEvent(digit string, at time.Time, content int) *nostr.Event {
	return &nostr.Event{
		ID: fmt.Sprintf("%064x", at.UnixNano()+int64(content)+int64(digit[0])), PubKey: hexKey(digit), Kind: presence.Kind,
		CreatedAt: at.Unix(), Tags: nostr.Tags{}, Content: strings.Repeat("x", content), Sig: strings.Repeat("0", 128),
	}
}

// countingStore counts the reads of a channel's set.
type countingStore struct {
	presence.Store
	reads int
}

func (c *countingStore) Current(ctx context.Context, community, channel uuid.UUID, now time.Time) []*nostr.Event {
	c.reads++
	return c.Store.Current(ctx, community, channel, now)
}

// A REQ reads each channel's set once, however often its filters name the
// channel: a filter repeating one channel id 999 times (within the
// filter-value limit) read and parsed the whole set 999 times and held
// every copy until the limit cut it, so a few hundred announcements made one
// REQ allocate most of a gigabyte.
// Mutation killed: reading the set for every #h value (reads = 999 + 999).
func TestSelectReadsEachChannelOnce(t *testing.T) {
	t.Parallel()
	m := presence.NewMemory(time.Minute, 100, 1<<20, 1<<20)
	community, channel := uuid.New(), uuid.New()
	now := time.Unix(1_000_000, 0)
	for _, digit := range []string{"a", "b", "c"} {
		ev := fakeEvent(digit, now, 10)
		ev.Tags = nostr.Tags{{"h", channel.String()}}
		m.Remember(community, channel, ev, now)
	}
	repeated := make([]string, 999)
	for i := range repeated {
		repeated[i] = channel.String()
	}
	repeated[1] = strings.ToUpper(channel.String()) // the same channel, spelled otherwise
	filters := nostr.Filters{
		{Kinds: []int{presence.Kind}, Tags: map[string][]string{"h": repeated}},
		{Kinds: []int{presence.Kind}, Tags: map[string][]string{"h": repeated}, Limit: ptr(1)},
	}
	store := &countingStore{Store: m}
	got := selectAll(context.Background(), store, community, filters, now, 500, nil)
	require.Len(t, got, 3, "each announcement once")
	require.Equal(t, 1, store.reads, "one read of the channel for the whole REQ")
}

func ptr[T any](v T) *T { return &v }

// selectAll chooses what filters get and reads it all, parsed.
func selectAll(ctx context.Context, s presence.Store, community uuid.UUID, filters nostr.Filters, now time.Time, maxLimit int, stored *presence.StoredCount) []*nostr.Event {
	plan := presence.Choose(ctx, s, community, filters, now, maxLimit, stored)
	var out []*nostr.Event
	for batch := plan.Next(ctx, 3); batch != nil; batch = plan.Next(ctx, 3) {
		for _, raw := range batch {
			ev, err := nostr.ParseEvent(raw, nostr.Limits{})
			if err != nil {
				panic(err)
			}
			out = append(out, ev)
		}
	}
	return out
}

// generatingStore answers every channel with perChannel fresh announcements
// and keeps only weak pointers to them, so the test can tell which ones the
// caller still holds when it reads the next channel.
type generatingStore struct {
	perChannel int
	handedOut  []weak.Pointer[nostr.Event]
	// mostHeld is the most announcements of earlier channels still reachable
	// when a later channel was read.
	mostHeld int
}

func (g *generatingStore) Remember(uuid.UUID, uuid.UUID, *nostr.Event, time.Time) error { return nil }

// Held implements presence.Store: the announcement Current made for the
// pubkey, made again.
func (g *generatingStore) Held(_ context.Context, _ uuid.UUID, wants []presence.Want, now time.Time) [][]byte {
	out := make([][]byte, len(wants))
	for i, w := range wants {
		var n int
		if _, err := fmt.Sscanf(w.PubKey, "%x", &n); err == nil {
			out[i] = g.made(w.Channel, now, n).AppendJSON(nil)
		}
	}
	return out
}

func (g *generatingStore) made(channel uuid.UUID, now time.Time, n int) *nostr.Event {
	ev := fakeEvent("a", now, 100)
	ev.ID = fmt.Sprintf("%064x", n)
	ev.PubKey = fmt.Sprintf("%064x", n)
	ev.CreatedAt = now.Unix() - int64(n) // each older than the last
	ev.Tags = nostr.Tags{{"h", channel.String()}}
	return ev
}

func (g *generatingStore) Current(_ context.Context, _, channel uuid.UUID, now time.Time) []*nostr.Event {
	runtime.GC()
	held := 0
	for _, p := range g.handedOut {
		if p.Value() != nil {
			held++
		}
	}
	g.mostHeld = max(g.mostHeld, held)
	out := make([]*nostr.Event, g.perChannel)
	for i := range out {
		ev := g.made(channel, now, len(g.handedOut))
		out[i] = ev
		g.handedOut = append(g.handedOut, weak.Make(ev))
	}
	return out
}

// A REQ naming many channels holds, besides the channel being read, only
// what its filters' limits can still return: each channel may hold up to
// BUZZ_PRESENCE_MAX_CHANNEL_BYTES (4 MiB), and one REQ may name thousands
// of channels, so keeping every channel's set until the end held their
// sum (gigabytes with Redis, where nothing bounds the channels together).
// Mutation killed: keeping every channel's set until the limits are cut at
// the end (950 announcements held when the last of 20 channels was read).
func TestSelectHoldsOnlyWhatTheLimitKeeps(t *testing.T) {
	t.Parallel()
	const channels, perChannel, limit = 20, 50, 5
	named := make([]string, channels)
	for i := range named {
		named[i] = uuid.NewString()
	}
	store := &generatingStore{perChannel: perChannel}
	filters := nostr.Filters{{Kinds: []int{presence.Kind}, Tags: map[string][]string{"h": named}, Limit: ptr(limit)}}
	got := selectAll(context.Background(), store, uuid.New(), filters, time.Unix(1_000_000, 0), 500, nil)
	require.Len(t, got, limit)
	require.Equal(t, fmt.Sprintf("%064x", 0), got[0].ID, "the newest first")
	// The limit's worth kept, and the channel read last, which the
	// collector may not have seen die yet.
	require.LessOrEqual(t, store.mostHeld, limit+perChannel, "announcements of earlier channels still held")
}

// An agent_owner filter never matches an announcement (the event cannot
// say who owns its author), so its channels are not read at all.
// Mutation killed: asksPresence ignoring AgentOwner (one read for nothing).
func TestSelectSkipsAgentOwnerFilters(t *testing.T) {
	t.Parallel()
	store := &countingStore{Store: presence.NewMemory(time.Minute, 100, 1<<20, 1<<20)}
	filters := nostr.Filters{{Kinds: []int{presence.Kind}, Tags: map[string][]string{"h": {uuid.NewString()}}, AgentOwner: hexKey("b")}}
	require.Empty(t, selectAll(context.Background(), store, uuid.New(), filters, time.Unix(1_000_000, 0), 500, nil))
	require.Zero(t, store.reads)
}

// A store that other communities filled refuses no announcement of a
// community holding less than its share (the bounds divided among the
// communities holding presence): it is relayed but not kept, as in a full
// channel, while the community that filled the store is refused. Anyone
// may announce under fresh keys in an open channel, and one community
// flooded so made every other community's presence refused, not relayed.
//
// Mutation killed: ErrFull whenever the store is full (the second
// community's announcement is refused).
func TestMemoryFullOfOneCommunityRefusesOnlyIt(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	one := len(fakeEvent("a", now, 1000).AppendJSON(nil))
	m := presence.NewMemory(time.Minute, 100, 3*one, 1<<20)
	flooded, flooder, other, otherChannel := uuid.New(), uuid.New(), uuid.New(), uuid.New()
	for _, pubkey := range []string{"a", "b", "c"} {
		require.NoError(t, m.Remember(flooded, flooder, fakeEvent(pubkey, now, 1000), now))
	}
	require.ErrorIs(t, m.Remember(flooded, flooder, fakeEvent("d", now, 1000), now), presence.ErrFull)

	require.NoError(t, m.Remember(other, otherChannel, fakeEvent("x", now, 1000), now),
		"another community's announcement refused because the flooded one filled the store")
	require.Empty(t, m.Current(context.Background(), other, otherChannel, now), "kept past the store's bound")
	require.Len(t, m.Current(context.Background(), flooded, flooder, now), 3)
}
