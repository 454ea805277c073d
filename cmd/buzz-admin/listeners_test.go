package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
)

func TestListenersCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.URL(t)
	env := func(k string) string {
		if k == "BUZZ_DATABASE_URL" {
			return url
		}
		return ""
	}
	runJSON := func(v any, args ...string) error {
		var out bytes.Buffer
		if err := run(ctx, args, env, &out); err != nil {
			return err
		}
		return json.Unmarshal(out.Bytes(), v)
	}
	key := func(c string) string { return strings.Repeat(c, 64) }
	listener, other, t1, t2 := key("a"), key("b"), key("1"), key("2")

	var added map[string]any
	require.NoError(t, runJSON(&added, "listeners", "add", strings.ToUpper(listener), t1, t2, t1))
	require.Equal(t, map[string]any{"listener": listener, "registered": 2.0}, added)
	require.NoError(t, runJSON(&added, "listeners", "add", other, t2))

	// A backlog for the listener: one pending row, one being sent.
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `
		WITH c AS (INSERT INTO communities (host) VALUES ('team.example') RETURNING id)
		INSERT INTO operator_listener_outbox
		    (listener_pubkey, target_pubkey, community_id, event_id, event_kind, event_created_at, state, claim_id, lease_until)
		SELECT decode($1, 'hex'), decode($2, 'hex'), c.id, decode(repeat(s, 64), 'hex'), 9, now(),
		       CASE s WHEN 'c' THEN 'sending' ELSE 'pending' END,
		       CASE s WHEN 'c' THEN gen_random_uuid() END,
		       CASE s WHEN 'c' THEN now() + interval '30 seconds' END
		FROM c, unnest(ARRAY['c', 'd']) AS s`, listener, t1)
	require.NoError(t, err)

	var list []listenerJSON
	require.NoError(t, runJSON(&list, "listeners", "list"))
	require.Len(t, list, 2)
	require.Equal(t, listener, list[0].Listener)
	require.Len(t, list[0].Targets, 2)
	require.Equal(t, int64(1), list[0].Backlog.Pending)
	require.Equal(t, int64(1), list[0].Backlog.Sending)
	require.NotNil(t, list[0].Backlog.OldestCreatedAt)
	require.Equal(t, other, list[1].Listener)
	require.Equal(t, []targetJSON{{Pubkey: t2, CreatedAt: list[1].Targets[0].CreatedAt}}, list[1].Targets)
	require.Equal(t, backlogJSON{}, list[1].Backlog)

	require.NoError(t, runJSON(&list, "listeners", "list", other))
	require.Len(t, list, 1)

	var removed map[string]any
	require.NoError(t, runJSON(&removed, "listeners", "remove", listener, t1, t2))
	require.Equal(t, map[string]any{"listener": listener, "removed": 2.0}, removed)
	require.NoError(t, runJSON(&list, "listeners", "list", listener))
	require.Len(t, list, 1, "a listener with a backlog still shows without registrations")
	require.Empty(t, list[0].Targets)
	// The removed target's queued row went with it; the one being sent stays.
	require.Equal(t, int64(0), list[0].Backlog.Pending)
	require.Equal(t, int64(1), list[0].Backlog.Sending)

	require.NoError(t, runJSON(&list, "listeners", "list", key("e")))
	require.Empty(t, list)

	for _, args := range [][]string{
		{"listeners", "add", listener}, {"listeners", "remove", listener},
		{"listeners", "list", listener, t1}, {"listeners", "purge", listener, t1},
	} {
		require.ErrorAs(t, run(ctx, args, env, &bytes.Buffer{}), &usageError{}, args)
	}
	// A malformed key is a usage error (exit 2) naming the key, found
	// before any connection (the environment names no database).
	// Mutation killed: the key error returned as a plain error (exit 1).
	noDatabase := func(string) string { return "" }
	for _, args := range [][]string{{"listeners", "add", "abc", t1}, {"listeners", "remove", listener, "g" + t1[1:]}, {"listeners", "list", t1 + "00"}} {
		var u usageError
		require.ErrorAs(t, run(ctx, args, noDatabase, &bytes.Buffer{}), &u, args)
		require.Contains(t, u.reason, "is not a 64-char hex public key", args)
		var stdout, stderr bytes.Buffer
		require.Equal(t, 2, exitStatus(run(ctx, args, noDatabase, &bytes.Buffer{}), &stdout, &stderr), args)
	}
	require.ErrorContains(t, run(ctx, []string{"listeners", "list"}, func(string) string { return "" }, &bytes.Buffer{}), "BUZZ_DATABASE_URL")
}
