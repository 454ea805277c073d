package ingest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// TestMentionRowsAreCappedPerEvent: an event naming more distinct pubkeys
// than the cap is stored whole, with mention rows for its first ones only.
// Mutation killed: writing a row per p tag (one event wrote 2,000 rows).
func TestMentionRowsAreCappedPerEvent(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "mention-cap.example", 0)
	f.p = ingest.New(f.pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: time.Minute, MaxMentions: 3})
	var tags nostr.Tags
	var first []string
	for i := 0; i < 6; i++ {
		pk := f.key().PublicKeyHex()
		tags = append(tags, nostr.Tag{"p", pk}, nostr.Tag{"p", pk}) // repeats count once
		if i < 3 {
			first = append(first, pk)
		}
	}
	ev := f.store(f.sign(f.key(), 3, "", tags, 0))
	var got []string
	for _, m := range f.mentions(ev.ID) {
		got = append(got, m.Pubkey)
	}
	require.ElementsMatch(t, first, got)
	require.Equal(t, 1, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1 AND jsonb_array_length(tags) = 12`, ev.ID), "stored whole")
}

// TestThreadDepthIsCapped: replies down to the cap are stored with their
// depth; one more level is refused and leaves no thread rows. Mutation
// killed: no depth cap (each reply updated one row per ancestor, unbounded).
func TestThreadDepthIsCapped(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "depth-cap.example", 0)
	f.p = ingest.New(f.pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: time.Minute, MaxThreadDepth: 3})
	alice := f.key()
	ch := f.channel(alice, false)
	parent := f.store(f.sign(alice, ingest.KindChat, "root", nostr.Tags{{"h", ch}}, f.base))
	for depth := 1; depth <= 3; depth++ {
		parent = f.store(f.sign(alice, ingest.KindChat, "reply", nostr.Tags{{"h", ch}, {"e", parent.ID, "", "reply"}}, f.base+int64(depth)))
		row, ok := f.thread(parent.ID)
		require.True(t, ok)
		require.Equal(t, depth, row.depth)
	}
	rows := f.count(`SELECT count(*) FROM thread_metadata`)
	f.rejected(f.sign(alice, ingest.KindChat, "too deep", nostr.Tags{{"h", ch}, {"e", parent.ID, "", "reply"}}, f.base+10),
		"invalid: thread is too deep: replies may sit at most 3 levels below the root; reply higher up")
	require.Equal(t, rows, f.count(`SELECT count(*) FROM thread_metadata`))
}
