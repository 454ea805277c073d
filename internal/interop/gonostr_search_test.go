package interop

import (
	"testing"

	"github.com/nbd-wtf/go-nostr"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/relaytest"
)

// TestGoNostrSearchFindsLinks: a NIP-50 search for a link finds the notes
// containing it, however the note writes it (with a query string, at the
// end of a sentence, without its scheme), and a search for its host or its
// path does too; a link to another page does not match.
func TestGoNostrSearchFindsLinks(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c := connectGo(t, r)
	now := nostr.Now()
	full := c.publish(1, "look at https://example.com/docs/page?x=1 now", nil, now-50)
	sentence := c.publish(1, "The docs are at https://Example.com/docs/page.", nil, now-40)
	bare := c.publish(1, "see example.com/docs/page, it explains", nil, now-30)
	other := c.publish(1, "not that one: https://example.com/blog/post", nil, now-20)
	elsewhere := c.publish(1, "https://example.org/docs/page is a mirror", nil, now-10)

	search := func(q string) []string {
		t.Helper()
		return ids(c.fetch(nostr.Filter{Kinds: []int{1}, Search: q}))
	}
	page := []string{full.ID, sentence.ID, bare.ID}
	require.ElementsMatch(t, page, search("https://example.com/docs/page"))
	require.ElementsMatch(t, page, search("example.com/docs/page"))
	require.ElementsMatch(t, page, search("HTTP://EXAMPLE.COM/docs/page"))
	require.ElementsMatch(t, []string{full.ID}, search("https://example.com/docs/page?x=1"))
	require.ElementsMatch(t, append(page, other.ID), search("example.com"))
	require.ElementsMatch(t, append(page, other.ID), search("https://example.com/"))
	require.ElementsMatch(t, append(page, elsewhere.ID), search("/docs/page"))
	require.ElementsMatch(t, []string{full.ID}, search("look https://example.com/docs/page"), "words and a link together")
	require.Empty(t, search("https://example.com/docs/pages"))
	require.EqualValues(t, 3, c.count(nostr.Filter{Kinds: []int{1}, Search: "https://example.com/docs/page"}))
	require.Empty(t, search(`https://x.com/it's\a'quote`), "tsquery quoting")
}
