package fanout

import (
	"sync"
	"time"

	"github.com/google/uuid"
)

// RememberPublished makes the hub remember the stored events it publishes
// (and replays), by community and id, for at least window, and for as
// long as hold reports true, up to most of them; call it before the hub is
// used. A relay process that missed the other processes' live traffic for
// a while replays what the database received meanwhile (Replay), and what
// this hub already published (its own writes, and what it heard just
// before the gap) must not reach its subscribers twice. hold is true from
// a gap's start until its replay is done, so the whole gap is kept. The
// community is part of what is remembered: one signed event sent to two
// communities is stored in each, and each community's subscribers get
// their copy live.
func (h *Hub) RememberPublished(window time.Duration, most int, hold func() bool) {
	h.published.Store(&publishedIDs{
		current: map[publishedEvent]struct{}{}, previous: map[publishedEvent]struct{}{},
		rotatedAt: time.Now(), window: window, most: most, hold: hold,
	})
}

// publishedEvent is one community's stored copy of an event.
type publishedEvent struct {
	community uuid.UUID
	id        string
}

// publishedIDs is a set of published events in two generations: they are
// added to current, and every window (unless held) previous is forgotten
// and current takes its place, so one stays between one and two windows.
type publishedIDs struct {
	mu                sync.Mutex
	current, previous map[publishedEvent]struct{}
	rotatedAt         time.Time
	window            time.Duration
	most              int
	hold              func() bool
}

// add records community's copy of event id; it reports false when it was
// there already. Past most events (held for a long gap, or an unforeseen
// rate) nothing more is recorded: the replay that needs them refuses a gap
// that large anyway.
func (p *publishedIDs) add(community uuid.UUID, id string) (added bool) {
	ev := publishedEvent{community: community, id: id}
	p.mu.Lock()
	defer p.mu.Unlock()
	if now := time.Now(); now.Sub(p.rotatedAt) >= p.window && !p.hold() {
		clear(p.previous)
		p.previous, p.current = p.current, p.previous
		p.rotatedAt = now
	}
	if _, ok := p.current[ev]; ok {
		return false
	}
	if _, ok := p.previous[ev]; ok {
		return false
	}
	if len(p.current)+len(p.previous) < p.most {
		p.current[ev] = struct{}{}
	}
	return true
}
