package relay_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A note its author deleted by id before publishing it, sent afterwards into
// a private channel while the deletion is community-global (nothing told it
// a channel), is refused as superseded and never served, and no reader
// learns anything new: what each reader gets (a channel member, the owner,
// a removed member, a community member outside the channel) from the
// channel's history by REQ and COUNT, the bridge's /query, the note's id
// and the deletions is the same after the note was sent as before.
// Mutation killed: without the trigger events_deleted_id_refused the note
// is stored, and the member's and owner's answers change.
func TestDeletedNoteSentLaterToAPrivateChannelStaysHidden(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	dial := func() *relaytest.Client {
		c := r.Dial(t, "")
		c.Auth(nil)
		return c
	}
	owner, member, removed, outsider := dial(), dial(), dial(), dial()
	ch := createChannel(t, owner, "secret", true)
	for _, c := range []*relaytest.Client{member, removed} {
		require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", c.Key.PublicKeyHex()}}, 0)).OK)
	}
	require.True(t, owner.Publish(owner.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", removed.Key.PublicKeyHex()}}, 0)).OK)

	note := member.Sign(9, "said, then deleted", nostr.Tags{{"h", ch}}, 0)
	deletion := member.Sign(5, "", nostr.Tags{{"e", note.ID}}, 0)
	ok := member.Publish(deletion)
	require.True(t, ok.OK, ok.Msg)

	sub := 0
	history := func(c *relaytest.Client, filter map[string]any) string {
		t.Helper()
		sub++
		id := fmt.Sprint("view-", sub)
		c.Send("REQ", id, filter)
		var got []string
		for {
			reply := c.NextReply()
			switch reply.Verb {
			case "EVENT":
				got = append(got, reply.Event.ID)
			case "EOSE":
				c.Send("CLOSE", id)
				return strings.Join(got, ",")
			case "CLOSED":
				return "CLOSED " + reply.Msg
			default:
				t.Fatalf("REQ: unexpected %+v", reply)
			}
		}
	}
	count := func(c *relaytest.Client, filter map[string]any) string {
		t.Helper()
		sub++
		c.Send("COUNT", fmt.Sprint("count-", sub), filter)
		reply := c.NextReply()
		if reply.Verb == "COUNT" {
			return fmt.Sprint(reply.Count)
		}
		return reply.Verb + " " + reply.Msg
	}
	view := func(c *relaytest.Client) []string {
		t.Helper()
		inChannel := map[string]any{"#h": []string{ch}}
		bridge := post(t, r, c.Key, "/query", query(inChannel))
		return []string{
			"history " + history(c, inChannel),
			"note " + history(c, map[string]any{"ids": []string{note.ID}}),
			"deletions " + history(c, map[string]any{"kinds": []int{5}}),
			"count " + count(c, inChannel),
			fmt.Sprint("query ", bridge.Status, " ", strings.Join(ids(bridge.Events), ","), bridge.Error),
		}
	}
	readers := map[string]*relaytest.Client{"owner": owner, "member": member, "removed": removed, "outsider": outsider}
	before := map[string][]string{}
	for name, c := range readers {
		before[name] = view(c)
	}
	require.Contains(t, before["outsider"], "deletions "+deletion.ID, "the deletion is community-global")

	ok = member.Publish(note)
	require.True(t, ok.OK, ok.Msg)
	for name, c := range readers {
		after := view(c)
		require.Equal(t, before[name], after, "what %s reads changed", name)
		require.Contains(t, after, "note ", "%s is served the deleted note", name)
	}
	require.Equal(t, "duplicate: this event's deletion, or a newer version of its address, is already stored", ok.Msg)
}

// A moderator's removal deleted by its author before it reached the relay,
// replayed later by anyone, is answered OK false "blocked: ..." on the same
// connection, and removes nobody: the member still writes to the channel.
// A chat message deleted first is still answered OK true "duplicate: ...".
// Mutations killed: the trigger skipping the removal (OK true, duplicate);
// the rule unmapped in ingest (OK false, invalid:).
func TestRetractedRemovalIsBlockedNotApplied(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner, member := r.Dial(t, ""), r.Dial(t, "")
	owner.Auth(nil)
	member.Auth(nil)
	ch := createChannel(t, owner, "retracted", true)
	require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", member.Key.PublicKeyHex()}}, 0)).OK)

	removal := owner.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", member.Key.PublicKeyHex()}}, 0)
	ok := owner.Publish(owner.Sign(5, "", nostr.Tags{{"e", removal.ID}}, 0))
	require.True(t, ok.OK, ok.Msg)
	ok = owner.Publish(removal)
	require.False(t, ok.OK)
	require.Equal(t, "blocked: its author deleted this event before it arrived here, so it is not applied", ok.Msg)

	said := member.Publish(member.Sign(9, "still a member", nostr.Tags{{"h", ch}}, 0))
	require.True(t, said.OK, "the retracted removal removed nobody: %s", said.Msg)

	message := owner.Sign(9, "said, then deleted", nostr.Tags{{"h", ch}}, 0)
	ok = owner.Publish(owner.Sign(5, "", nostr.Tags{{"e", message.ID}}, 0))
	require.True(t, ok.OK, ok.Msg)
	ok = owner.Publish(message)
	require.True(t, ok.OK, "on the same connection, other kinds unchanged: %s", ok.Msg)
	require.True(t, strings.HasPrefix(ok.Msg, "duplicate: "), ok.Msg)
}
