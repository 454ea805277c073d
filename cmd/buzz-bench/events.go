package main

import (
	"context"
	"encoding/hex"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/btcsuite/btcd/btcec/v2"
	"github.com/btcsuite/btcd/btcec/v2/schnorr"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// signer signs events with one key. It calls btcec with FastSign rather than
// nostr.(*Event).Sign, which verifies every signature it makes: that halves
// the cost of pre-signing tens of thousands of events on a small machine,
// and the relay verifies each one anyway.
type signer struct {
	priv   *btcec.PrivateKey
	pubHex string
}

func newSigner() (*signer, error) {
	priv, err := btcec.NewPrivateKey()
	if err != nil {
		return nil, err
	}
	return &signer{priv: priv, pubHex: hex.EncodeToString(schnorr.SerializePubKey(priv.PubKey()))}, nil
}

// sign sets PubKey, ID and Sig.
func (s *signer) sign(ev *nostr.Event) error {
	if ev.Tags == nil {
		ev.Tags = nostr.Tags{}
	}
	ev.PubKey = s.pubHex
	id := ev.ComputeID()
	sig, err := schnorr.Sign(s.priv, id[:], schnorr.FastSign())
	if err != nil {
		return err
	}
	ev.ID = hex.EncodeToString(id[:])
	ev.Sig = hex.EncodeToString(sig.Serialize())
	return nil
}

// Event content starts with a marker "<run id>/<stream>/<seq> " naming who
// sent it, so a subscriber can look up its send time without a shared map.

// The padding after the marker is words, so NIP-50 search has something to
// find: every event long enough holds loremText's words, one in rareEvery
// also rareWord. Streams start at different offsets (rareStride apart), so
// many short streams still hold their share of rare events.
const (
	loremText  = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et dolore magna aliqua "
	rareWord   = "quokka"
	rareEvery  = 1000
	rareStride = 389
)

// isRare reports whether event seq of stream carries rareWord.
func isRare(stream, seq int) bool { return (stream*rareStride+seq)%rareEvery == 0 }

// content returns the marker padded with words to size bytes.
func content(runID string, stream, seq, size int) string {
	b := make([]byte, 0, max(size, len(runID)+24))
	b = append(b, runID...)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(stream), 10)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(seq), 10)
	b = append(b, ' ')
	if isRare(stream, seq) && len(b)+len(rareWord)+1 <= size {
		b = append(b, rareWord+" "...)
	}
	for i := 0; len(b) < size; i++ {
		b = append(b, loremText[i%len(loremText)])
	}
	return string(b)
}

// parseMarker reads the marker of content; ok is false for events of other
// runs or other clients.
func parseMarker(content []byte, runID string) (stream, seq int, ok bool) {
	if len(content) <= len(runID) || string(content[:len(runID)]) != runID || content[len(runID)] != '/' {
		return 0, 0, false
	}
	rest := content[len(runID)+1:]
	stream, rest, ok = leadingInt(rest, '/')
	if !ok {
		return 0, 0, false
	}
	seq, _, ok = leadingInt(rest, ' ')
	return stream, seq, ok
}

// leadingInt parses the decimal digits of b up to end.
func leadingInt(b []byte, end byte) (n int, rest []byte, ok bool) {
	for i, c := range b {
		switch {
		case c == end && i > 0:
			return n, b[i+1:], true
		case c < '0' || c > '9' || i >= 9:
			return 0, nil, false
		}
		n = n*10 + int(c-'0')
	}
	return 0, nil, false
}

// sendClock records when each marked event was sent, so subscribers can turn
// a received marker into a delivery latency.
type sendClock struct{ at [][]atomic.Int64 }

func newSendClock(streams, perStream int) *sendClock {
	c := &sendClock{at: make([][]atomic.Int64, streams)}
	for i := range c.at {
		c.at[i] = make([]atomic.Int64, perStream)
	}
	return c
}

// perStream is how many events each stream may send.
func (c *sendClock) perStream() int {
	if len(c.at) == 0 {
		return 0
	}
	return len(c.at[0])
}

// mark records that (stream, seq) is being sent now and returns the time.
func (c *sendClock) mark(stream, seq int) int64 {
	now := monoNow()
	c.at[stream][seq].Store(now)
	return now
}

// since returns how long ago (stream, seq) was sent, relative to now.
func (c *sendClock) since(stream, seq int, now int64) (time.Duration, bool) {
	if stream < 0 || stream >= len(c.at) || seq < 0 || seq >= len(c.at[stream]) {
		return 0, false
	}
	sent := c.at[stream][seq].Load()
	if sent == 0 {
		return 0, false
	}
	return time.Duration(now - sent), true
}

// signedEvent is a ready-to-send EVENT frame.
type signedEvent struct {
	frame []byte
	id    string
	seq   int
}

// eventSpec describes the kind-1 events one publisher sends.
type eventSpec struct {
	signer       *signer
	runID        string
	stream       int // the publisher's index, part of the marker
	contentBytes int
	tags         nostr.Tags
	topics       int // if > 0, each event also gets a t tag "topic-<seq mod topics>"
	prefill      int // signed before the clock starts
	budget       int // signed at most, prefill included
}

func (sp *eventSpec) build(seq int) (signedEvent, error) {
	ev := nostr.Event{
		Kind:      nostr.KindTextNote,
		CreatedAt: time.Now().Unix(),
		Tags:      sp.tags,
		Content:   content(sp.runID, sp.stream, seq, sp.contentBytes),
	}
	if sp.topics > 0 {
		ev.Tags = append(slices.Clip(sp.tags), nostr.Tag{"t", "topic-" + strconv.Itoa(seq%sp.topics)})
	}
	if err := sp.signer.sign(&ev); err != nil {
		return signedEvent{}, err
	}
	return signedEvent{frame: eventFrame("EVENT", &ev), id: ev.ID, seq: seq}, nil
}

// eventSource is one publisher's supply of signed events. newEventSource
// signs the prefill up front; if the relay outruns it, refill signs
// refillChunk more whenever the supply drops below a quarter, so signing
// stays out of the timed loop as long as the prefill suffices, and late
// signing is counted.
type eventSource struct {
	spec   eventSpec
	out    chan signedEvent
	refill chan struct{}
	next   int          // sequence of the next event to sign (refill goroutine only)
	late   atomic.Int64 // events signed after the prefill
	waits  atomic.Int64 // times the publisher found the supply empty
}

// refillChunk is how many events one refill signs.
const refillChunk = 64

func newEventSource(spec eventSpec) (*eventSource, error) {
	s := &eventSource{spec: spec, out: make(chan signedEvent, max(spec.prefill, 1)), refill: make(chan struct{}, 1)}
	for ; s.next < spec.prefill; s.next++ {
		ev, err := spec.build(s.next)
		if err != nil {
			return nil, err
		}
		s.out <- ev
	}
	if s.next >= spec.budget {
		close(s.out)
	}
	return s, nil
}

// start runs the refill goroutine until the budget is signed or ctx ends.
func (s *eventSource) start(ctx context.Context) {
	if s.next >= s.spec.budget {
		return
	}
	go func() {
		defer close(s.out)
		for s.next < s.spec.budget {
			select {
			case <-s.refill:
			case <-ctx.Done():
				return
			}
			// A chunk, not the whole shortfall: every publisher crosses its
			// quarter at about the same moment, and topping all of them up at
			// once spent a second of both cores signing, inside the timed
			// run, which the OK latencies then measured as the relay's.
			for n := 0; n < refillChunk && s.next < s.spec.budget && len(s.out) < cap(s.out); n, s.next = n+1, s.next+1 {
				ev, err := s.spec.build(s.next)
				if err != nil {
					return
				}
				s.out <- ev // cannot block: only this goroutine sends
				s.late.Add(1)
			}
		}
	}()
}

// take returns the next event; ok is false when the supply is exhausted or
// ctx ended.
func (s *eventSource) take(ctx context.Context) (ev signedEvent, ok bool) {
	if len(s.out) == 0 {
		s.waits.Add(1)
		s.askRefill()
	}
	select {
	case ev, ok = <-s.out:
	case <-ctx.Done():
		return signedEvent{}, false
	}
	if len(s.out) < cap(s.out)/4 {
		s.askRefill()
	}
	return ev, ok
}

func (s *eventSource) askRefill() {
	select {
	case s.refill <- struct{}{}:
	default:
	}
}
