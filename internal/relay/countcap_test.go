package relay_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A COUNT stops counting at eventstore.MaxCount and says the answer is
// approximate (NIP-45), over WebSocket and the bridge alike: counted to the
// end, any reader's COUNT of a whole community read every one of its rows.
// MaxCount matches exactly, or one fewer, are still counted exactly.
//
// Mutations killed: Count answering the rows its statement counted as they
// are (10,001, without "approximate"); Count calling MaxCount matches
// approximate. That the statement stops reading is
// eventstore's TestCountReadsAtMostMaxCountRows.
func TestCountStopsAtMaxCountAndSaysSo(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	key := relaytest.NewKey(t)
	c := r.Dial(t, "")
	c.Auth(key)

	// MaxCount+2 kind 1 notes, MaxCount-1 kind 7 reactions and one kind 6
	// repost, stored
	// straight into the database: signing twenty thousand events would
	// only slow the test.
	insert := func(kind, n int) {
		_, err := r.Pool.Exec(t.Context(), `INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig)
			SELECT $1, sha256(int8send($2 * 1000000 + i) || $3::bytea), '\x`+strings.Repeat("ab", 32)+`', now() - i * interval '1 ms',
			       $2, '[]', 'x', '\x`+strings.Repeat("cd", 64)+`'
			FROM generate_series(1, $4::int) i`, r.CommunityID, kind, r.CommunityID[:], n)
		require.NoError(t, err)
	}
	insert(1, eventstore.MaxCount+2)
	insert(7, eventstore.MaxCount-1)
	insert(6, 1)

	capped := fmt.Sprintf(`{"count":%d,"approximate":true}`, eventstore.MaxCount)
	exact := fmt.Sprintf(`{"count":%d}`, eventstore.MaxCount-1)
	count := func(sub string, filters ...map[string]any) string {
		c.Send(append([]any{"COUNT", sub}, anySlice(filters)...)...)
		reply := c.Next()
		require.Len(t, reply, 3)
		return string(reply[2])
	}
	require.JSONEq(t, capped, count("all", map[string]any{}))
	require.JSONEq(t, capped, count("notes", map[string]any{"kinds": []int{1}}))
	require.JSONEq(t, exact, count("reactions", map[string]any{"kinds": []int{7}}))
	require.JSONEq(t, fmt.Sprintf(`{"count":%d}`, eventstore.MaxCount),
		count("reactions and reposts", map[string]any{"kinds": []int{7}}, map[string]any{"kinds": []int{6}}))

	got := post(t, r, key, "/count", query(map[string]any{"kinds": []int{1}}))
	require.JSONEq(t, capped, got.Raw)
	got = post(t, r, key, "/count", query(map[string]any{"kinds": []int{7}}))
	require.JSONEq(t, exact, got.Raw)

	// The connection goes on reading.
	c.Send("REQ", "after", map[string]any{"kinds": []int{7}, "limit": 1})
	c.Expect("EVENT")
	c.Expect("EOSE")
}
