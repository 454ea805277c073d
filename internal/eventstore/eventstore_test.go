package eventstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/nostr"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func TestBuilderBindsEveryValue(t *testing.T) {
	t.Parallel()
	hostile := "x'); DROP TABLE events; --"
	since, limit := int64(5), 7
	filters := nostr.Filters{
		{Kinds: []int{1}, Tags: map[string][]string{"t": {hostile}, "e": {"a"}}, Since: &since, Limit: &limit},
		{Authors: []string{strings.Repeat("ab", 32)}},
	}
	community := uuid.New()
	sql, args, ok := eventstore.BuildSelect(community, eventstore.Scope{}, filters, 100)
	require.True(t, ok)
	require.NotContains(t, sql, hostile)
	require.NotContains(t, sql, community.String())
	require.Contains(t, args, []string{"t:" + hostile})
	require.Equal(t, 2, strings.Count(sql, "community_id = $1 AND deleted_at IS NULL AND (channel_id IS NULL OR channel_id = ANY($2::uuid[]))"), "every branch is scoped to the community and the reader's channels")
	name, body, _ := strings.Cut(sql, "\n")
	require.Equal(t, "-- name: EventsQuery", name, "a hand-built statement is named like a generated one")
	require.Less(t, strings.Index(body, "e:"), 0, "tag keys are parameters, not text")
	// Tag names are emitted in sorted order, so one filter shape gives one statement text.
	require.Less(t, strings.Index(sql, "tag_index && $"), strings.LastIndex(sql, "tag_index && $"))

	count, countArgs, ok := eventstore.BuildCount(community, eventstore.Scope{}, filters)
	require.True(t, ok)
	require.NotContains(t, count, hostile)
	require.Contains(t, countArgs, []string{"t:" + hostile})
}

// A #h read may return a deletion stored in the named channel without an h
// tag, so its statement also selects kind 5 rows of that channel; a read
// whose kinds leave out deletions (a channel's timeline of kind 9) keeps the
// plain tag test, and the plan it had.
//
// Mutation killed: the deletion branch added whatever the filter's kinds
// (the timeline's statement carries it).
func TestBuilderAddsTheDeletionBranchOnlyWhenDeletionsCanMatch(t *testing.T) {
	t.Parallel()
	channel := uuid.NewString()
	const branch = "OR (kind = 5 AND channel_id = ANY("
	for _, c := range []struct {
		kinds []int
		want  bool
	}{{nil, true}, {[]int{5, 9}, true}, {[]int{9}, false}, {[]int{7, 9}, false}} {
		f := nostr.Filter{Kinds: c.kinds, Tags: map[string][]string{"h": {channel}}}
		sql, _, ok := eventstore.BuildSelect(uuid.New(), eventstore.Scope{}, nostr.Filters{f}, 100)
		require.True(t, ok, c.kinds)
		require.Equal(t, c.want, strings.Contains(sql, branch), "kinds %v: %s", c.kinds, sql)
	}
}

func TestBuilderSkipsFiltersThatMatchNothing(t *testing.T) {
	t.Parallel()
	zero, since, until := 0, int64(10), int64(5)
	for _, f := range []nostr.Filter{
		{IDs: []string{}}, {Authors: []string{}}, {Kinds: []int{}},
		{Tags: map[string][]string{"e": {}}}, {Since: &since, Until: &until},
	} {
		_, _, ok := eventstore.BuildSelect(uuid.New(), eventstore.Scope{}, nostr.Filters{f}, 100)
		require.False(t, ok, "%+v", f)
		_, _, ok = eventstore.BuildCount(uuid.New(), eventstore.Scope{}, nostr.Filters{f})
		require.False(t, ok, "%+v", f)
	}
	// limit 0 asks for no stored events, but COUNT ignores limits.
	_, _, ok := eventstore.BuildSelect(uuid.New(), eventstore.Scope{}, nostr.Filters{{Limit: &zero}}, 100)
	require.False(t, ok)
	_, _, ok = eventstore.BuildCount(uuid.New(), eventstore.Scope{}, nostr.Filters{{Limit: &zero}})
	require.True(t, ok)
}

// TestQueryAgreesWithInMemoryMatching stores a random event set and checks,
// for many random filter sets, that the SQL built for them returns exactly
// what nostr.Filter.Matches selects (newest first, per-filter limits,
// deleted rows hidden before the limit, another community's rows never).
func TestQueryAgreesWithInMemoryMatching(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	q := db.New(pool)
	home, err := q.CommunityCreate(ctx, "home.example")
	require.NoError(t, err)
	other, err := q.CommunityCreate(ctx, "other.example")
	require.NoError(t, err)

	rng := rand.New(rand.NewPCG(1, 2))
	keys := make([]*nostr.SecretKey, 4)
	for i := range keys {
		keys[i], err = nostr.GenerateSecretKey()
		require.NoError(t, err)
	}
	pick := func(vals ...string) string { return vals[rng.IntN(len(vals))] }
	var live []*nostr.Event
	for i := 0; i < 240; i++ {
		tags := nostr.Tags{}
		for j := rng.IntN(3); j > 0; j-- {
			tags = append(tags, nostr.Tag{pick("t", "e", "p"), pick("a", "b", "c")})
		}
		ev := &nostr.Event{Kind: []int{1, 7, 9, 1111}[rng.IntN(4)], CreatedAt: 1_700_000_000 + int64(rng.IntN(60)), Tags: tags, Content: fmt.Sprint(i)}
		require.NoError(t, ev.Sign(keys[rng.IntN(len(keys))]))
		community := home.ID
		if i%5 == 0 {
			community = other.ID // decoys that must never come back
		}
		params, err := eventstore.InsertParams(community, ev, nil)
		require.NoError(t, err)
		n, err := q.EventInsert(ctx, params)
		require.NoError(t, err)
		require.Equal(t, int64(1), n)
		if community != home.ID {
			continue
		}
		if i%7 == 0 {
			id := ev.IDBytes()
			_, err := q.EventsDeleteByIDs(ctx, db.EventsDeleteByIDsParams{CommunityID: home.ID, Ids: [][]byte{id[:]}, Author: func() []byte { p := ev.PubKeyBytes(); return p[:] }()})
			require.NoError(t, err)
			continue
		}
		live = append(live, ev)
	}

	store := eventstore.New(pool, 50)
	randomFilter := func() nostr.Filter {
		var f nostr.Filter
		if rng.IntN(3) == 0 {
			f.Kinds = []int{[]int{1, 7, 9, 1111}[rng.IntN(4)], 7}
		}
		if rng.IntN(4) == 0 {
			f.Authors = []string{keys[rng.IntN(len(keys))].PublicKeyHex()}
		}
		if rng.IntN(3) == 0 {
			f.Tags = map[string][]string{pick("t", "e", "p"): {pick("a", "b", "c"), pick("a", "b", "c")}}
			if rng.IntN(2) == 0 {
				f.Tags[pick("t", "e", "p")] = []string{pick("a", "b", "c")}
			}
		}
		if rng.IntN(6) == 0 && len(live) > 0 {
			f.IDs = []string{live[rng.IntN(len(live))].ID, strings.Repeat("0", 64)}
		}
		if rng.IntN(3) == 0 {
			s := int64(1_700_000_000 + rng.IntN(60))
			f.Since = &s
		}
		if rng.IntN(3) == 0 {
			u := int64(1_700_000_000 + rng.IntN(60))
			f.Until = &u
		}
		if rng.IntN(2) == 0 {
			l := rng.IntN(20)
			f.Limit = &l
		}
		return f
	}
	newestFirst := func(a, b *nostr.Event) int {
		if a.CreatedAt != b.CreatedAt {
			return int(b.CreatedAt - a.CreatedAt)
		}
		return strings.Compare(b.ID, a.ID)
	}
	for round := 0; round < 150; round++ {
		filters := nostr.Filters{randomFilter()}
		if rng.IntN(3) == 0 {
			filters = append(filters, randomFilter())
		}
		want := map[string]bool{}
		var wantCount int64
		for _, ev := range live {
			if filters.Matches(ev) {
				wantCount++
			}
		}
		var wantOrdered []string
		for i := range filters {
			var matched []*nostr.Event
			for _, ev := range live {
				if filters[i].Matches(ev) {
					matched = append(matched, ev)
				}
			}
			slices.SortFunc(matched, newestFirst)
			limit := 50
			if filters[i].Limit != nil && *filters[i].Limit < limit {
				limit = *filters[i].Limit
			}
			for _, ev := range matched[:min(limit, len(matched))] {
				want[ev.ID] = true
				wantOrdered = append(wantOrdered, ev.ID)
			}
		}
		var got []string
		var gotEvents []*nostr.Event
		require.NoError(t, store.Query(ctx, home.ID, eventstore.Scope{Reader: keys[0].PublicKeyHex()}, filters, func(ev *nostr.Event, _ *uuid.UUID) error {
			got = append(got, ev.ID)
			gotEvents = append(gotEvents, ev)
			return nil
		}))
		require.ElementsMatch(t, slices.Collect(func(yield func(string) bool) {
			for id := range want {
				if !yield(id) {
					return
				}
			}
		}), got, "round %d filters %+v", round, filters)
		require.True(t, slices.IsSortedFunc(gotEvents, newestFirst), "results must be newest first")
		if len(filters) == 1 {
			require.Equal(t, wantOrdered, got)
		}
		for _, ev := range gotEvents {
			require.NoError(t, ev.Verify(), "a stored event must come back byte-identical")
		}
		count, _, err := store.Count(ctx, home.ID, eventstore.Scope{Reader: keys[0].PublicKeyHex()}, filters)
		require.NoError(t, err)
		require.Equal(t, wantCount, count, "round %d COUNT %+v", round, filters)
	}
}

// A reader sees channel-less rows and rows of its readable channels only,
// and p-gated kinds only when they are addressed to it.
func TestScopeHidesUnreadableChannelsAndOthersPGatedEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	q := db.New(pool)
	home, err := q.CommunityCreate(ctx, "scope.example")
	require.NoError(t, err)
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	reader, other := strings.Repeat("a", 64), strings.Repeat("b", 64)
	readable, hidden := uuid.New(), uuid.New()
	store := eventstore.New(pool, 100)
	var want []string
	put := func(kind int, channel *uuid.UUID, tags nostr.Tags, visible bool) {
		ev := &nostr.Event{Kind: kind, CreatedAt: 1_700_000_000, Content: fmt.Sprint(kind, channel, tags), Tags: tags}
		require.NoError(t, ev.Sign(key))
		params, err := eventstore.InsertParams(home.ID, ev, channel)
		require.NoError(t, err)
		_, err = q.EventInsert(ctx, params)
		require.NoError(t, err)
		if visible {
			want = append(want, ev.ID)
		}
	}
	put(9, &readable, nostr.Tags{}, true)
	put(9, &hidden, nostr.Tags{}, false)
	put(1, nil, nostr.Tags{}, true)
	put(1059, nil, nostr.Tags{{"p", reader}}, true)
	put(1059, nil, nostr.Tags{{"p", other}}, false)
	put(44100, nil, nostr.Tags{{"p", other}}, false)

	scope := eventstore.Scope{Channels: []uuid.UUID{readable}, Reader: reader}
	var got []string
	require.NoError(t, store.Query(ctx, home.ID, scope, nostr.Filters{{}}, func(ev *nostr.Event, _ *uuid.UUID) error {
		got = append(got, ev.ID)
		return nil
	}))
	require.ElementsMatch(t, want, got)
	n, _, err := store.Count(ctx, home.ID, scope, nostr.Filters{{}})
	require.NoError(t, err)
	require.Equal(t, int64(len(want)), n)
}

// TestStoredTagsReadBackExactly: tags come back from the jsonb column as
// they were signed, whatever needs escaping, so a client recomputing the id
// from a REQ's answer gets the signed one. The JSON a read sends, built
// from the row's bytes, is the event's own encoding byte for byte.
// Mutations killed: dropping spaces inside strings, or keeping jsonb's
// between elements; an escape jsonb prints differently from the encoder;
// columns decoded in the wrong order.
func TestStoredTagsReadBackExactly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	q := db.New(pool)
	home, err := q.CommunityCreate(ctx, "home.example")
	require.NoError(t, err)
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	ev := &nostr.Event{Kind: 1, CreatedAt: 1_700_000_000, Content: "tricky \"content\", [\"a\", \"b\"] \\ \x7f\x01 \r\n 🐝", Tags: nostr.Tags{
		{"t", "go"},
		{"subject", "quote \" backslash \\ newline \n tab \t unit separator \x1f"},
		{"emoji", "café 🐝 \u2028 <b>&amp;</b>"},
		{"spaces", "  a, b  ", "\\\"", "", "\", \"", "[\"x\", \"y\"]"},
		{"p", strings.Repeat("ab", 32), "wss://relay.example", "mention"},
	}}
	require.NoError(t, ev.Sign(key))
	params, err := eventstore.InsertParams(home.ID, ev, nil)
	require.NoError(t, err)
	_, err = q.EventInsert(ctx, params)
	require.NoError(t, err)

	var got []*nostr.Event
	err = eventstore.New(pool, 10).Query(ctx, home.ID, eventstore.Scope{}, nostr.Filters{{IDs: []string{ev.ID}}}, func(e *nostr.Event, _ *uuid.UUID) error {
		got = append(got, e)
		return nil
	})
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, ev.Tags, got[0].Tags)
	require.Equal(t, string(nostr.EncodeEvent("s", ev)), string(nostr.EncodeEvent("s", got[0])))
	require.NoError(t, got[0].Verify())

	var raw [][]byte
	err = eventstore.New(pool, 10).QueryJSON(ctx, home.ID, eventstore.Scope{}, nostr.Filters{{Kinds: []int{1}}}, func(event []byte, _ *uuid.UUID) error {
		raw = append(raw, event)
		return nil
	})
	require.NoError(t, err)
	require.Len(t, raw, 1)
	require.Equal(t, string(ev.AppendJSON(nil)), string(raw[0]))
}
