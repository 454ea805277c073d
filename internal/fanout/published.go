package fanout

import (
	"sync"
	"time"
)

// RememberPublished makes the hub remember the ids of the stored events it
// publishes (and replays), for at least window, and for as long as hold
// reports true, up to most ids; call it before the hub is used. A relay
// process that missed the other processes' live traffic for a while
// replays what the database received meanwhile (Replay), and what this
// hub already published (its own writes, and what it heard just before
// the gap) must not reach its subscribers twice. hold is true from a gap's
// start until its replay is done, so the ids of the whole gap are kept.
func (h *Hub) RememberPublished(window time.Duration, most int, hold func() bool) {
	h.published.Store(&publishedIDs{
		current: map[string]struct{}{}, previous: map[string]struct{}{},
		rotatedAt: time.Now(), window: window, most: most, hold: hold,
	})
}

// publishedIDs is a set of event ids in two generations: ids are added to
// current, and every window (unless held) previous is forgotten and
// current takes its place, so an id stays between one and two windows.
type publishedIDs struct {
	mu                sync.Mutex
	current, previous map[string]struct{}
	rotatedAt         time.Time
	window            time.Duration
	most              int
	hold              func() bool
}

// add records id; it reports false when id was there already. Past most
// ids (held for a long gap, or an unforeseen rate) nothing more is
// recorded: the replay that needs them refuses a gap that large anyway.
func (p *publishedIDs) add(id string) (added bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now := time.Now(); now.Sub(p.rotatedAt) >= p.window && !p.hold() {
		clear(p.previous)
		p.previous, p.current = p.current, p.previous
		p.rotatedAt = now
	}
	if _, ok := p.current[id]; ok {
		return false
	}
	if _, ok := p.previous[id]; ok {
		return false
	}
	if len(p.current)+len(p.previous) < p.most {
		p.current[id] = struct{}{}
	}
	return true
}
