package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	acp "github.com/coder/acp-go-sdk"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// Any member can ask the agent to write at length. An answer longer than
// the relay takes is posted cut to the relay's advertised limits, saying
// so, rather than lost: past max_content_length the relay refuses it for
// good, and past four times its frame limit it closes the connection, so
// the bridge reconnected and posted it again until the prompt timeout (and
// again at every restart, from the state file), deaf to every other
// channel each time.
func TestLongAnswerIsCutToWhatTheRelayTakes(t *testing.T) {
	t.Parallel()
	const maxContent = 20_000 // below the default, so only the relay's NIP-11 says it
	w := newWorldOn(t, []func(*config.Config){func(c *config.Config) { c.MaxContentLength = maxContent }})

	for _, n := range []int{2 << 20, 30_000} {
		asked := w.mention(fmt.Sprintf("@Robby write at length [long %d]", n))
		answer := w.answerTo(asked.ID)
		require.Equal(t, maxContent, utf8.RuneCountInString(answer.Content), "cut to the relay's limit exactly")
		require.True(t, strings.HasSuffix(answer.Content, answerCutNote), "the answer says it was cut")
	}
	// The channel is still served, over the same connection.
	w.answerTo(w.mention("@Robby short one").ID)
	// Counted once the relay's OK is back, which may follow the answer's
	// arrival here.
	require.Eventually(t, func() bool { return w.status.snapshot().Answers == 3 }, relaytest.Patience, 10*time.Millisecond)
	s := w.status.snapshot()
	require.Zero(t, s.Reconnects, "the long answer never cost the connection")
	require.Zero(t, s.Failures)
}

// The agent's text is held only up to what could ever be posted, however
// much it streams: an agent told to write without end does not grow the
// bridge's memory without end.
func TestAnswerTextHeldIsBounded(t *testing.T) {
	t.Parallel()
	a := &localAgent{answers: map[acp.SessionId]*answerText{}, maxAnswerBytes: 1000}
	got := a.collect("s1")
	chunk := strings.Repeat("y", 300)
	for range 10_000 { // 3 MB streamed
		a.appendText("s1", chunk)
	}
	text, cut := got.result()
	require.True(t, cut)
	require.Equal(t, 1000, len(text))
}

// Cutting keeps the content within both limits the relay advertises: its
// characters, and the bytes of the EVENT frame, which JSON escaping can
// make six times the content's own (a control character is \u00XX).
func TestFitAnswer(t *testing.T) {
	t.Parallel()
	tags := nostr.Tags{{"h", "6a3b1a4e-4c64-4f34-9b7e-0d1b5b5a1c11"}}
	lim := answerLimits{maxContentChars: 1000, maxMessageBytes: 100_000}

	short := fitAnswer("hello", false, tags, lim)
	require.Equal(t, "hello", short, "what fits is posted as it is")

	require.Equal(t, "hello"+answerCutNote, fitAnswer("hello", true, tags, lim),
		"text the bridge stopped holding says so even when short")

	long := fitAnswer(strings.Repeat("é", 5000), false, tags, lim)
	require.Equal(t, 1000, utf8.RuneCountInString(long))
	require.True(t, strings.HasSuffix(long, answerCutNote))
	require.LessOrEqual(t, eventFrameBytes(long, tags), lim.maxMessageBytes)

	lim.maxMessageBytes = 1500
	escaped := fitAnswer(strings.Repeat("\x01", 5000), false, tags, lim)
	require.True(t, strings.HasSuffix(escaped, answerCutNote))
	require.LessOrEqual(t, eventFrameBytes(escaped, tags), lim.maxMessageBytes, "the frame fits, not only the characters")
	require.Greater(t, eventFrameBytes(escaped, tags), lim.maxMessageBytes-10, "and is cut no shorter than it must be")
}

// A relay restarted with other limits is noticed on the reconnection: the
// bridge reads the relay's NIP-11 limits on every connection, not only the
// first, so an answer is cut to what the relay now takes instead of being
// refused for good (here the limit went down, from the default to 20 000
// characters).
//
// Mutation killed: the limits read on the first connection only: the
// 30 000-character answer is posted whole, the restarted relay refuses it
// (invalid: content too long), and it never appears.
func TestLimitsAreReadAgainOnReconnecting(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	const n, maxContent = 30_000, 20_000
	whole := w.answerTo(w.mention(fmt.Sprintf("@Robby write at length [long %d]", n)).ID)
	require.Greater(t, utf8.RuneCountInString(whole.Content), n, "under the default limit the answer is whole")

	// The same community, database and relay key, served by a relay with a
	// lower limit; buzz-acp's connection is cut and reaches it.
	restarted := relaytest.StartOn(t, w.r.Pool, func(c *config.Config) { c.MaxContentLength = maxContent })
	w.proxy.retarget(strings.TrimPrefix(restarted.URL, "ws://"))
	w.proxy.cut()
	w.waitConnected(1)

	// Asked on the restarted relay, which alone tells buzz-acp of it live.
	owner := restarted.Dial(t, w.host)
	owner.Auth(w.owner.Key)
	asked := owner.Sign(9, fmt.Sprintf("@Robby write at length again [long %d]", n), nostr.Tags{{"h", w.channel}, {"p", w.agentKey.PublicKeyHex()}}, 0)
	ok := owner.Publish(asked)
	require.True(t, ok.OK, ok.Msg)
	answer := w.answerTo(asked.ID)
	require.Equal(t, maxContent, utf8.RuneCountInString(answer.Content), "cut to the restarted relay's limit exactly")
	require.True(t, strings.HasSuffix(answer.Content, answerCutNote))
}

// A relay whose information document hangs while its WebSocket works is
// reconnected to with the limits last read: the document is read again on
// each connection, and it took the whole 30 s dial budget, so every
// reconnection failed. Mutation killed: the re-read on the dial's context
// (buzz-acp never connects again).
func TestReconnectsWhileTheInformationDocumentHangs(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.proxy.mu.Lock()
	w.proxy.infoHangs = true
	w.proxy.mu.Unlock()
	w.proxy.cut()
	w.waitConnected(1)
	w.answerTo(w.mention("@Robby still there?").ID)
}

// An answer that finds no connection before its turn's time runs out is
// counted as a failure, and the log says what becomes of it: posted at the
// next start with a state file, lost without one (it said "posted at the
// next start" either way, and nothing kept it).
//
// Mutation killed: the state file's message without a state file.
func TestUnpostedAnswerSaysWhetherAStartWillPostIt(t *testing.T) {
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	answer := &nostr.Event{Kind: 9, Content: "too late", Tags: nostr.Tags{{"h", "c"}}, CreatedAt: time.Now().Unix()}
	require.NoError(t, answer.Sign(key))
	for _, tc := range []struct {
		stateFile string
		says      string
	}{
		{"", "answer not posted, and lost: without BUZZ_ACP_STATE_FILE"},
		{filepath.Join(t.TempDir(), "state.jsonl"), "answer not posted; it is posted at the next start"},
	} {
		j, err := openJournal(tc.stateFile)
		require.NoError(t, err)
		var logged bytes.Buffer
		st := newStatus(nil, "ws://relay", key.PublicKeyHex())
		b := newBridge(settings{Key: key, IncomingQueue: 1}, nil, j, slog.New(slog.NewTextHandler(&logged, nil)), st)
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // the turn's time is up, and no connection came
		b.postAnswer(ctx, "asked", answer.CreatedAt, answer, "")
		j.close()
		require.EqualValues(t, 1, st.snapshot().Failures)
		require.Contains(t, logged.String(), tc.says, "state file %q", tc.stateFile)
	}
}

// An answer is signed again only when the relay refused it for its
// created_at (invalid:, naming created_at) and it is older than the floor
// the relay advertises: any other refusal says nothing about a new
// created_at, and a fresh answer refused for its date is not the floor's.
// The one signed again says the same, dated now.
//
// Mutation killed: signing again after any invalid: refusal of an old
// answer (the created_at condition dropped): the content refusal is signed
// again.
func TestAnswerIsSignedAgainOnlyForTheFloorsRefusal(t *testing.T) {
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	j, err := openJournal("")
	require.NoError(t, err)
	b := newBridge(settings{Key: key, IncomingQueue: 1}, nil, j, slog.New(slog.DiscardHandler), newStatus(nil, "ws://relay", key.PublicKeyHex()))
	const floor = 60
	b.limits = answerLimits{createdAtFloor: floor}.orDefaults()
	signed := func(age int64) *nostr.Event {
		ev := &nostr.Event{Kind: 9, Content: "ack", Tags: nostr.Tags{{"h", "c"}}, CreatedAt: time.Now().Unix() - age}
		require.NoError(t, ev.Sign(key))
		return ev
	}
	floorRefusal := &relayRefusal{Msg: "invalid: a channel event's created_at is too far in the past to store; sign it again with the current time"}

	old := signed(2 * floor)
	again := b.redatedPastFloor(old, floorRefusal)
	require.NotNil(t, again)
	require.NoError(t, again.Verify())
	require.Equal(t, old.Content, again.Content)
	require.Equal(t, old.Tags, again.Tags)
	require.Greater(t, again.CreatedAt, old.CreatedAt)

	for name, tc := range map[string]struct {
		reply *nostr.Event
		err   error
	}{
		"another invalid: refusal": {old, &relayRefusal{Msg: "invalid: content is longer than the relay accepts"}},
		"a duplicate":              {old, &relayRefusal{Msg: "duplicate: already have this event"}},
		"no refusal":               {old, context.DeadlineExceeded},
		"accepted":                 {old, nil},
		"within the floor":         {signed(floor / 2), floorRefusal},
	} {
		require.Nil(t, b.redatedPastFloor(tc.reply, tc.err), name)
	}
	b.limits = defaultAnswerLimits // no floor advertised: a relay without a replica
	require.Nil(t, b.redatedPastFloor(old, floorRefusal), "no floor")
}
