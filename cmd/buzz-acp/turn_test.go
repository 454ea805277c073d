package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// cancelsLogged counts the session/cancel notifications the stub received.
func (w *world) cancelsLogged() int {
	w.t.Helper()
	raw, err := os.ReadFile(w.stubLog)
	if os.IsNotExist(err) {
		return 0
	}
	require.NoError(w.t, err)
	return strings.Count(string(raw), `"cancelled":true`)
}

// answerMentioning waits for the agent's answer whose text names id
// anywhere, so one that has something else in front is found too.
func (w *world) answerMentioning(id string) *nostr.Event {
	w.t.Helper()
	var answer *nostr.Event
	require.Eventually(w.t, func() bool {
		for _, ev := range w.owner.Req("answers", map[string]any{"kinds": []int{9}, "#h": []string{w.channel}, "authors": []string{w.agentKey.PublicKeyHex()}}) {
			if strings.Contains(ev.Content, "ack "+id+" in ") {
				answer = ev
				return true
			}
		}
		return false
	}, waitLong, 20*time.Millisecond, "the agent's answer to %s appears in the channel", id)
	return answer
}

// An agent that ignores the cancel of a timed-out turn, and streams more of
// it afterwards, but does end it within the cancel grace: the session's next
// turn starts only once it has, so its answer holds its own text only, in
// the same session.
//
// Mutation killed: the next turn starting at the timeout (as before): the
// stubborn turn's "late text of ..." lands at the front of the next answer.
func TestTimedOutTurnsLateTextStaysOutOfTheNextAnswer(t *testing.T) {
	t.Parallel()
	w := newWorld(t, func(cfg *settings) {
		cfg.PromptTimeout = 2 * time.Second
		cfg.CancelGrace = waitLong
	})
	stubborn := w.mention("@Robby [stubborn] take your time")
	next := w.mention("@Robby and then this")
	require.Eventually(t, func() bool { return w.cancelsLogged() >= 1 }, waitLong, 10*time.Millisecond, "the turn times out and is cancelled")
	require.NoError(t, os.WriteFile(w.holdFile, nil, 0o600))

	answer := w.answerMentioning(next.ID)
	require.Equal(t, "ack "+next.ID+" in stub-1", answer.Content, "the next turn's answer holds its own text only")
	require.Equal(t, "stub-1", w.promptFor(next.ID).Session, "the session goes on once the turn ended")
	for _, ev := range w.owner.Req("all", map[string]any{"kinds": []int{9}, "#h": []string{w.channel}, "authors": []string{w.agentKey.PublicKeyHex()}}) {
		require.NotContains(t, ev.Content, stubborn.ID, "the timed-out turn is never answered")
	}
}

// An agent that ignores the cancel and does not end the turn within the
// cancel grace: the bridge gives the session up, the next prompt of the
// channel opens a new one and is answered, and what the stubborn turn
// streams later, on the old session, reaches no answer.
//
// Mutation killed: the next turn starting at the timeout in the same session
// (as before): the stubborn turn's late text lands in the next answer; with
// the wait but no giving up, the next turn waits for the stubborn one,
// which never ends (no answer within the test's patience).
func TestStubbornTurnGivesItsSessionUp(t *testing.T) {
	t.Parallel()
	w := newWorld(t, func(cfg *settings) {
		cfg.PromptTimeout = 2 * time.Second
		cfg.CancelGrace = time.Second
	})
	stubborn := w.mention("@Robby [stubborn] take your time")
	next := w.mention("@Robby and then this")

	answer := w.answerMentioning(next.ID)
	require.Equal(t, "ack "+next.ID+" in stub-2", answer.Content, "the next turn runs in a new session, with its own text only")

	// The stubborn turn streams its late text now, on the abandoned session.
	require.NoError(t, os.WriteFile(w.holdFile, nil, 0o600))
	after := w.mention("@Robby one more")
	require.Equal(t, "ack "+after.ID+" in stub-2", w.answerMentioning(after.ID).Content)
	for _, ev := range w.owner.Req("all", map[string]any{"kinds": []int{9}, "#h": []string{w.channel}, "authors": []string{w.agentKey.PublicKeyHex()}}) {
		require.NotContains(t, ev.Content, stubborn.ID, "the stubborn turn's text reaches no answer")
	}
}
