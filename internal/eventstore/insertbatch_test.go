package eventstore_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// A row written by the multi-row insert is the row the single-row insert
// writes, column for column, NULLs included (no channel, no d tag, no
// expiration), and ReadStored tells the stored rows from an event already
// stored and from a second copy inside the batch.
//
// Mutations killed: pgArray.Index handing out another element; a NULL
// written for a present channel, d tag or expiration (or a value for an
// absent one); ReadStored matching a row to the wrong position.
func TestInsertBatchWritesTheRowsOneInsertWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	q := db.New(pool)
	batched, single := mustCommunity(t, q, "batched.example"), mustCommunity(t, q, "single.example")
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	channel := uuid.New()
	sign := func(kind int, tags nostr.Tags, content string) *nostr.Event {
		ev := &nostr.Event{Kind: kind, CreatedAt: 1_700_000_000 + int64(len(content)), Tags: tags, Content: content}
		require.NoError(t, ev.Sign(key))
		return ev
	}
	events := []struct {
		ev      *nostr.Event
		channel *uuid.UUID
	}{
		{sign(1, nostr.Tags{{"t", "a<b>&c"}, {"e", "x", "", "root"}}, "a note"), nil},
		{sign(9, nostr.Tags{{"h", channel.String()}}, "in a channel, \"quoted\" \\ and ü \u2028"), &channel},
		{sign(30023, nostr.Tags{{"d", "slot\tone"}, {"expiration", "1800000000"}}, "addressable, expiring"), nil},
		{sign(1, nostr.Tags{{"expiration", "1800000001"}}, "expiring\x01"), &channel},
	}
	already := sign(1, nostr.Tags{}, "stored before the batch")
	stored, err := eventstore.InsertParams(batched.ID, already, nil)
	require.NoError(t, err)
	_, err = q.EventInsert(ctx, stored)
	require.NoError(t, err)

	rows := eventstore.NewInsertBatch(2) // fewer than it gets: the columns grow
	for _, e := range events {
		p, err := eventstore.InsertParams(batched.ID, e.ev, e.channel)
		require.NoError(t, err)
		rows.Add(p)
		p, err = eventstore.InsertParams(single.ID, e.ev, e.channel)
		require.NoError(t, err)
		_, err = q.EventInsert(ctx, p)
		require.NoError(t, err)
	}
	rows.Add(stored)
	again, err := eventstore.InsertParams(batched.ID, events[1].ev, events[1].channel)
	require.NoError(t, err)
	rows.Add(again)

	var b pgx.Batch
	rows.Queue(&b)
	results := pool.SendBatch(ctx, &b)
	got, err := rows.ReadStored(results)
	require.NoError(t, err)
	require.NoError(t, results.Close())
	require.Equal(t, []bool{true, true, true, true, false, false}, got)

	read := func(community uuid.UUID) []string {
		r, err := pool.Query(ctx, `SELECT row(id, pubkey, created_at, kind, tags, content, sig, channel_id, d_tag, expires_at, tag_index)::text
			FROM events WHERE community_id = $1 AND id <> $2 ORDER BY id`, community, stored.ID)
		require.NoError(t, err)
		out, err := pgx.CollectRows(r, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	want := read(single.ID)
	require.Len(t, want, len(events))
	require.Equal(t, want, read(batched.ID))
}

// The tags column is written by the nostr package's encoder; PostgreSQL
// must read it as the jsonb encoding/json's text gave, escapes and all, and
// tags that encoder would write differently (invalid UTF-8, which
// encoding/json replaces) still go through encoding/json.
//
// Mutation killed: tagsJSON without its fallback (PostgreSQL refuses the
// raw invalid byte).
func TestInsertParamsTagsAreTheJSONEncodingJSONWrote(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	for _, tags := range []nostr.Tags{
		{},
		{{"t", "<script>&amp;</script>"}, {"x", "\u2028\u2029", "ü", "😀"}},
		{{"q", "\"", "\\", "/", "\b\f\n\r\t", "\x01\x1f\x7f"}},
		{{"e", ""}, {"bad", "\xff\xfe"}},
	} {
		p, err := eventstore.InsertParams(uuid.New(), &nostr.Event{Kind: 1, Tags: tags}, nil)
		require.NoError(t, err)
		old, err := json.Marshal(tags)
		require.NoError(t, err)
		var same bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT $1::text::jsonb = $2::text::jsonb", string(p.Tags), string(old)).Scan(&same), "%q", p.Tags)
		require.True(t, same, "%s against %s", p.Tags, old)
	}
}

func mustCommunity(t *testing.T, q *db.Queries, host string) db.Community {
	t.Helper()
	c, err := q.CommunityCreate(context.Background(), host)
	require.NoError(t, err)
	return c
}
