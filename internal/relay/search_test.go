package relay_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

func TestSearchIsOneShotRankedAndAccessFiltered(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	alice := r.Dial(t, "")
	alice.Auth(nil)
	bob := r.Dial(t, "")
	bob.Auth(nil)
	now := time.Now().Unix()

	weak := alice.Sign(1, "a note about postgres and other things entirely", nil, now-30)
	strong := alice.Sign(1, "postgres postgres: why postgres indexes matter", nil, now-60)
	unrelated := alice.Sign(1, "lunch plans", nil, now-10)
	for _, ev := range []*nostr.Event{weak, strong, unrelated} {
		require.True(t, alice.Publish(ev).OK)
	}
	secretChannel := createChannel(t, alice, "secret", true)
	hidden := alice.Sign(9, "postgres secret plans", nostr.Tags{{"h", secretChannel}}, now-5)
	require.True(t, alice.Publish(hidden).OK)
	wrap := alice.Sign(1059, "postgres", nostr.Tags{{"p", bob.Key.PublicKeyHex()}}, now-5)
	require.True(t, alice.Publish(wrap).OK)

	// Relevance first (not recency); the private channel and the gift wrap's
	// content never match for bob.
	got := bob.Req("s", map[string]any{"search": "postgres"})
	require.Equal(t, []string{strong.ID, weak.ID}, ids(got))
	require.Contains(t, ids(alice.Req("s2", map[string]any{"search": "secret plans"})), hidden.ID, "members find channel messages")
	require.Empty(t, bob.Req("s3", map[string]any{"search": "secret plans"}))
	bob.Send("COUNT", "c", map[string]any{"search": "postgres"})
	require.Equal(t, int64(2), bob.Expect("COUNT").Count)

	// Arbitrary user text is safe (no tsquery syntax errors).
	require.Empty(t, bob.Req("odd", map[string]any{"search": `"unbalanced & | ! ( <-> :*`}))

	// One-shot: no live delivery after EOSE.
	bob.Send("REQ", "once", map[string]any{"search": "postgres"})
	for bob.NextReply().Verb != "EOSE" {
	}
	require.True(t, alice.Publish(alice.Sign(1, "postgres again", nil, 0)).OK)
	bob.ExpectSilence(300*time.Millisecond, "a search subscription must not receive live events")
}

// A search ranks only its newest BUZZ_SEARCH_CANDIDATES matches (at least
// its limit), so a common word costs no more than a rare one: the most
// relevant match beyond them is not reached; within them, relevance wins
// over recency; a limit above the setting widens the candidates.
// Mutations killed: ranking every match (the old, strongest match comes
// first); ranking the candidates by recency only (weak before strong);
// candidates not widened to the limit (the fourth match is missing).
func TestSearchRanksTheNewestCandidates(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.SearchCandidates = 3 })
	alice := r.Dial(t, "")
	alice.Auth(nil)
	now := time.Now().Unix()
	oldStrongest := alice.Sign(1, "honey honey honey honey", nil, now-100)
	older := alice.Sign(1, "honey and other things said at length", nil, now-40)
	strong := alice.Sign(1, "honey honey", nil, now-30)
	weak := alice.Sign(1, "a long note that mentions honey only once among many words", nil, now-20)
	newest := alice.Sign(1, "honey bees and other things", nil, now-10)
	for _, ev := range []*nostr.Event{oldStrongest, older, strong, weak, newest} {
		require.True(t, alice.Publish(ev).OK)
	}
	got := ids(alice.Req("s", map[string]any{"search": "honey", "limit": 3}))
	require.ElementsMatch(t, []string{strong.ID, weak.ID, newest.ID}, got, "the three newest matches; an older one is not reached")
	require.Equal(t, strong.ID, got[0], "ranked by relevance among them")
	require.ElementsMatch(t, []string{strong.ID, weak.ID, newest.ID, older.ID}, ids(alice.Req("s2", map[string]any{"search": "honey", "limit": 4})),
		"a larger limit widens the candidates")
	// Next to another filter, a search is bounded alike.
	// Mutation killed: ranking every match of a search that is not alone.
	other := map[string]any{"ids": []string{strings.Repeat("0", 64)}}
	require.Equal(t, []string{strong.ID}, ids(alice.Req("s3", map[string]any{"search": "honey", "limit": 1}, other)),
		"the most relevant of the newest matches, not of every match")
}

// A search string is bounded: every word becomes a node of the tsquery,
// which PostgreSQL walks recursively, and some 20,000 words (40 KB, well
// inside a frame) exceeded its stack depth, failing the statement as
// "error: query failed" and logging an error for each such request.
// Mutation killed: no bound on the search (COUNT answers "error: query
// failed"; a search just over the bound is run).
func TestSearchLengthIsBounded(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c := r.Dial(t, "")
	c.Auth(nil)
	require.True(t, c.Publish(c.Sign(1, "a b c", nil, 0)).OK)

	c.Send("COUNT", "deep", map[string]any{"search": strings.Repeat("a ", 20000)})
	closed := c.Expect("CLOSED")
	require.Equal(t, "invalid: search too long (max 1024 bytes)", closed.Msg)
	c.Send("REQ", "long", map[string]any{"search": strings.Repeat("b", 1025)})
	closed = c.Expect("CLOSED")
	require.Equal(t, "invalid: search too long (max 1024 bytes)", closed.Msg)

	c.Send("COUNT", "max", map[string]any{"search": strings.Repeat("a ", 512)})
	require.Equal(t, int64(1), c.Expect("COUNT").Count)

	// The HTTP bridge parses filters alike.
	got := post(t, r, c.Key, "/count", query(map[string]any{"search": strings.Repeat("a ", 20000)}))
	require.Equal(t, http.StatusBadRequest, got.Status, got.Raw)
	require.Contains(t, got.Error, "search too long (max 1024 bytes)")
}

// NIP-50 lets a client add key:value extensions to a search (include:spam,
// language:en, domain:example.com) and tells relays to ignore those they do
// not support. Searched for as words, "orange include:spam" found only
// notes that also said "include" and "spam": nothing, for a client that
// appends an extension to every query. A colon that does not join two words
// (a time, say) stays part of the text, and a search of extensions alone
// has no words to match.
// Mutation killed: eventstore passing the search string through unchanged
// (every query with an extension matches nothing).
func TestSearchIgnoresNIP50Extensions(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c := r.Dial(t, "")
	c.Auth(nil)
	orange := c.Sign(1, "an orange cat", nil, 0)
	link := c.Sign(1, "meet me at 10:30", nil, 0)
	for _, ev := range []*nostr.Event{orange, link, c.Sign(1, "a purple dog", nil, 0)} {
		require.True(t, c.Publish(ev).OK)
	}
	for _, search := range []string{"orange include:spam", "language:en orange nsfw:false", "orange  domain:example.com sentiment:positive"} {
		require.Equal(t, []string{orange.ID}, ids(c.Req("ext", map[string]any{"search": search})), search)
		c.Send("COUNT", "ext", map[string]any{"search": search})
		require.Equal(t, int64(1), c.Expect("COUNT").Count, search)
	}
	// Next to another filter, the search branch ignores them alike.
	other := map[string]any{"ids": []string{strings.Repeat("0", 64)}}
	require.Equal(t, []string{orange.ID}, ids(c.Req("ext2", map[string]any{"search": "orange include:spam"}, other)))
	require.Equal(t, []string{link.ID}, ids(c.Req("time", map[string]any{"search": "10:30"})), "a time is text, not an extension")
	require.Empty(t, c.Req("only", map[string]any{"search": "include:spam"}), "nothing left to match")

	// The HTTP bridge reads through the same statements.
	got := post(t, r, c.Key, "/count", query(map[string]any{"search": "orange include:spam"}))
	require.Equal(t, http.StatusOK, got.Status, got.Raw)
	require.Contains(t, got.Raw, `"count":1`)
}
