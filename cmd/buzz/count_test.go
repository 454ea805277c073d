package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A COUNT the relay stopped counting prints "approximate": the count is a
// floor, not the number of matches. Mutation killed: the CLI printing the
// count alone ({"count":10000}).
func TestReqCountSaysWhenTheRelayStoppedCounting(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	env, _ := newUser(t, r)
	// Stored straight into the database: signing ten thousand events would
	// only slow the test.
	_, err := r.Pool.Exec(t.Context(), `INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig)
		SELECT $1, sha256(int8send(i)), '\x`+strings.Repeat("ab", 32)+`', now() - i * interval '1 ms',
		       1, '[]', 'x', '\x`+strings.Repeat("cd", 64)+`'
		FROM generate_series(1, $2::int) i`, r.CommunityID, eventstore.MaxCount+1)
	require.NoError(t, err)

	out := buzz(t, env, "", "req", "--count", `{"kinds":[1]}`)
	require.Equal(t, 0, out.code, out.stderr)
	require.JSONEq(t, fmt.Sprintf(`{"count":%d,"approximate":true}`, eventstore.MaxCount), out.stdout)
}
