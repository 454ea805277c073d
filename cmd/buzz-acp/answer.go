package main

import (
	"encoding/json"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// answerCutNote ends an answer cut to what the relay takes, so the channel
// knows it is not the whole of it.
const answerCutNote = "\n\n[cut: the answer was longer than the relay accepts]"

// answerLimits are the relay's limits on one event, from its NIP-11
// document (limitation.max_content_length and max_message_length). Any
// member can ask the agent to write at length; an answer over them is
// refused for good (content) or, past four times the frame limit, gets the
// connection closed, so it is cut to fit before it is signed.
type answerLimits struct {
	maxContentChars int // characters (code points) of content
	maxMessageBytes int // bytes of the EVENT frame
	// createdAtFloor is how long before its arrival a channel event may be
	// dated (limitation.created_at_lower_limit, seconds; 0: no floor).
	createdAtFloor int64
}

// defaultAnswerLimits are the relay's own defaults, used when its NIP-11
// document does not say.
var defaultAnswerLimits = answerLimits{maxContentChars: 64 << 10, maxMessageBytes: 256 << 10}

func (l answerLimits) orDefaults() answerLimits {
	if l.maxContentChars <= 0 {
		l.maxContentChars = defaultAnswerLimits.maxContentChars
	}
	if l.maxMessageBytes <= 0 {
		l.maxMessageBytes = defaultAnswerLimits.maxMessageBytes
	}
	return l
}

// heldBytes is as much of a turn's text as could ever be posted: no answer
// holds more characters than maxContentChars, of at most four bytes each,
// nor more bytes than a frame.
func (l answerLimits) heldBytes() int {
	return min(4*l.maxContentChars, l.maxMessageBytes)
}

// answerText is one turn's text as the agent streams it, held only up to
// max bytes; what comes beyond is dropped and the text marked cut.
type answerText struct {
	mu  sync.Mutex
	b   strings.Builder
	max int
	cut bool
}

func (a *answerText) write(s string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if room := a.max - a.b.Len(); len(s) > room {
		s = s[:max(room, 0)]
		a.cut = true
	}
	a.b.WriteString(s)
}

// result is the text held (it may end in half a character, which
// fitAnswer drops) and whether some was dropped.
func (a *answerText) result() (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.b.String(), a.cut
}

// fitAnswer returns text as it is when it fits the relay's limits as a
// kind 9 with tags; otherwise (or when the bridge already dropped some of
// it) its longest beginning that fits with answerCutNote after it.
func fitAnswer(text string, cut bool, tags nostr.Tags, lim answerLimits) string {
	if !cut && utf8.RuneCountInString(text) <= lim.maxContentChars && eventFrameBytes(text, tags) <= lim.maxMessageBytes {
		return text
	}
	// A character the cap split in two is dropped whole.
	runes := []rune(strings.ToValidUTF8(text, ""))
	keep := max(min(len(runes), lim.maxContentChars-utf8.RuneCountInString(answerCutNote)), 0)
	// The frame grows with the characters kept: the longest beginning whose
	// frame fits, found by halving.
	lo, hi := 0, keep
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if eventFrameBytes(string(runes[:mid])+answerCutNote, tags) <= lim.maxMessageBytes {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return string(runes[:lo]) + answerCutNote
}

// eventFrameBytes is the size of the EVENT frame that posts a kind 9 with
// this content and these tags, encoded as relayConn.write encodes it.
func eventFrameBytes(content string, tags nostr.Tags) int {
	ev := &nostr.Event{
		ID: strings.Repeat("0", 64), PubKey: strings.Repeat("0", 64), Sig: strings.Repeat("0", 128),
		Kind: 9, CreatedAt: 1 << 40, Tags: tags, Content: content,
	}
	b, _ := json.Marshal([]any{"EVENT", ev})
	return len(b)
}
