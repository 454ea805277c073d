package relay_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/presence"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A member removed while their history of a private channel streams in
// pages is sent nothing more of it: not what the channel stored after the
// removal, when a later page reaches it (a message dated before the page's
// position: its client's clock behind the relay's, or sent while the
// removal was in flight). The member reads through the HTTP bridge with
// net/http; between the first page and the second, the owner removes them
// and posts a message dated before every message the history has left.
// Both paged reads: by time, and a search's by relevance.
// Mutation killed: QueryJSON keeping the channels read when the request
// arrived for every page (scope.readAgain's answer dropped): the second
// page sends the message posted after the removal, in both reads; and
// querySearch not asking readAgain at all (the search fails: its pages
// never read the channels again).
func TestRemovedMemberIsSentNothingMoreOfAHistoryBeingStreamed(t *testing.T) {
	t.Parallel()
	for _, read := range []struct {
		name      string
		filter    map[string]any
		firstPage int // events the first page sends, newest first
	}{
		// A full page leaves its last row to the next.
		{"by time", map[string]any{"kinds": []int{9}}, 1},
		{"search", map[string]any{"kinds": []int{9}, "search": "removal"}, 2},
	} {
		t.Run(read.name, func(t *testing.T) {
			t.Parallel()
			r := relaytest.Start(t, func(c *config.Config) { c.ReqPageRows = 2 })
			owner := r.Dial(t, "")
			owner.Auth(nil)
			ch := createChannel(t, owner, "secret", true)
			member := relaytest.NewKey(t)
			require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}}, 0)).OK)
			newestFirst := pagedHistory(t, owner, ch, "before the removal")
			secret := owner.Sign(9, "after the removal", nostr.Tags{{"h", ch}}, time.Now().Unix()-1000)
			removed := removeBeforeTheSecondPage(t, r, owner, ch, member, func() { require.True(t, owner.Publish(secret).OK) })

			filter := map[string]any{"#h": []string{ch}}
			for k, v := range read.filter {
				filter[k] = v
			}
			got := post(t, r, member, "/query", query(filter))
			require.Equal(t, 200, got.Status, got.Raw)
			require.True(t, removed.Load(), "the history was read in one page: the removal never fell inside it")
			sent := ids(got.Events)
			require.NotContains(t, sent, secret.ID, "a removed member was sent a message posted after the removal")
			// The first page was read while a member.
			require.Equal(t, newestFirst[:read.firstPage], sent)
		})
	}
}

// Reading the channels again before a later page is a statement like the
// page's, bounded by the query timeout: the history streams under the
// connection's ctx, which bounds nothing, so a read of the channels from
// the database (the cached answer dropped by a membership change) that
// waited on a lock held the REQ and a read slot until the lock went. Here
// the owner changes a membership between the first and the second page and
// then holds channel_members locked; the reader gets the first page, then
// CLOSED with the timeout's reason, on the same connection.
// Mutation killed: QueryJSON calling scope.readAgain with its own ctx (no
// CLOSED comes while the lock is held).
func TestReadingTheChannelsAgainIsBoundedByTheQueryTimeout(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.ReqPageRows = 2; c.QueryTimeout = 3 * time.Second })
	owner := r.Dial(t, "")
	owner.Auth(nil)
	ch := createChannel(t, owner, "open", false)
	other := createChannel(t, owner, "other", true)
	newestFirst := pagedHistory(t, owner, ch, "history")
	var lock pgx.Tx
	t.Cleanup(func() {
		if lock != nil {
			_ = lock.Rollback(context.Background())
		}
	})
	r.Server.SetBeforeLaterPage(func() {
		if lock != nil {
			return
		}
		added := owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", other}, {"p", relaytest.NewKey(t).PublicKeyHex()}}, 0))
		require.True(t, added.OK, added.Msg)
		tx, err := r.Pool.Begin(context.Background())
		require.NoError(t, err)
		lock = tx
		_, err = tx.Exec(context.Background(), "LOCK TABLE channel_members IN ACCESS EXCLUSIVE MODE")
		require.NoError(t, err)
	})

	reader := r.Dial(t, "")
	reader.Auth(nil)
	reader.Send("REQ", "history", map[string]any{"#h": []string{ch}, "kinds": []int{9}})
	var sent []string
	for {
		msg, err := reader.TryNext(60 * time.Second)
		require.NoError(t, err, "no answer while the channels' read waited on the lock")
		var verb string
		require.NoError(t, json.Unmarshal(msg[0], &verb))
		if verb != "EVENT" {
			require.Equal(t, "CLOSED", verb, string(msg[0]))
			var reason string
			require.NoError(t, json.Unmarshal(msg[2], &reason))
			require.Equal(t, "error: query timed out; narrow the filter", reason)
			break
		}
		var ev nostr.Event
		require.NoError(t, json.Unmarshal(msg[2], &ev))
		sent = append(sent, ev.ID)
	}
	require.Equal(t, newestFirst[:1], sent, "the first page, then nothing")
}

// A member removed while their history of a private channel streams is
// sent none of the channel's presence either: presence goes out after the
// stored history, and the pins it is chosen for were checked when the
// request arrived. Read through the HTTP bridge with net/http; the owner
// removes the member between the first page and the second.
// Mutation killed: presencePlan choosing for the filters as they came
// (the owner's announcement follows the first page).
func TestRemovedMemberIsSentNoPresenceAfterAHistoryBeingStreamed(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.ReqPageRows = 2 })
	owner := r.Dial(t, "")
	owner.Auth(nil)
	ch := createChannel(t, owner, "secret", true)
	member := relaytest.NewKey(t)
	require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}}, 0)).OK)
	newestFirst := pagedHistory(t, owner, ch, "before the removal")
	online := owner.Sign(presence.Kind, `{"status":"online"}`, nostr.Tags{{"h", ch}}, time.Now().Unix())
	require.NoError(t, r.Server.RememberPresence(r.CommunityID, uuid.MustParse(ch), online))
	removed := removeBeforeTheSecondPage(t, r, owner, ch, member, nil)

	got := post(t, r, member, "/query", query(map[string]any{"#h": []string{ch}, "kinds": []int{9, presence.Kind}}))
	require.Equal(t, 200, got.Status, got.Raw)
	require.True(t, removed.Load(), "the history was read in one page: the removal never fell inside it")
	sent := ids(got.Events)
	require.NotContains(t, sent, online.ID, "a removed member was sent the channel's presence")
	require.Equal(t, newestFirst[:1], sent)
}

// pagedHistory publishes four messages into ch, 100 s back and older, so a
// read of two-row pages streams past its first page; their ids newest
// first.
func pagedHistory(t *testing.T, owner *relaytest.Client, ch, content string) []string {
	t.Helper()
	now := time.Now().Unix()
	var newestFirst []string
	for i := range 4 {
		ev := owner.Sign(9, content, nostr.Tags{{"h", ch}}, now-100-int64(i))
		require.True(t, owner.Publish(ev).OK)
		newestFirst = append(newestFirst, ev.ID)
	}
	return newestFirst
}

// removeBeforeTheSecondPage has the owner remove member from ch before the
// second page of the next paged read, then run then (nil: nothing more);
// the flag it returns says whether that happened.
func removeBeforeTheSecondPage(t *testing.T, r *relaytest.Relay, owner *relaytest.Client, ch string, member *nostr.SecretKey, then func()) *atomic.Bool {
	t.Helper()
	var removed atomic.Bool
	r.Server.SetBeforeLaterPage(func() {
		if removed.Swap(true) {
			return
		}
		got := owner.Publish(owner.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}}, 0))
		require.True(t, got.OK, got.Msg)
		if then != nil {
			then()
		}
	})
	return &removed
}
