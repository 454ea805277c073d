package ingest

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// Changes of one channel that run alone wait their turn in a line, one at a
// time. Such a change waits for the channel's row (a large channel's list
// fold holds it for up to seconds, or another change does), and a change
// waiting in PostgreSQL holds a pool connection all the while: a burst of
// changes into one channel during a fold would hold as many connections as
// changes, and every other channel's writes in the process would wait for
// one. In line they hold one between them, and they run in the order they
// joined it.
type changeLines struct {
	mu    sync.Mutex
	lines map[changeLineKey][]chan struct{}
	// waiting is how many changes wait for their turn now.
	waiting atomic.Int64
}

// changeLineKey is a channel: its community and id.
type changeLineKey struct {
	community uuid.UUID
	channel   uuid.UUID
}

// changeLineOf is the line of j's channel; false for an event naming none.
// The h tag is read as the channel id its handler locks the row of, so
// every spelling of one id (capitals, braces, a urn: prefix) is one line.
func changeLineOf(j *groupJob) (changeLineKey, bool) {
	return changeLineFor(j.w.Tenant.ID(), j.w.Event.Tags)
}

func changeLineFor(community uuid.UUID, tags nostr.Tags) (changeLineKey, bool) {
	h := tags.First("h")
	if h == nil {
		return changeLineKey{}, false
	}
	channel, err := uuid.Parse(h[1])
	if err != nil {
		return changeLineKey{}, false
	}
	return changeLineKey{community, channel}, true
}

// join puts j at the end of its channel's line (its turn comes at once
// when the line is empty); busyOnly: only if changes of the channel are in
// line already. It reports whether j joined.
func (l *changeLines) join(j *groupJob, busyOnly bool) bool {
	key, ok := changeLineOf(j)
	if !ok {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	line := l.lines[key]
	if busyOnly && len(line) == 0 {
		return false
	}
	turn := make(chan struct{})
	if len(line) == 0 {
		close(turn)
	}
	if l.lines == nil {
		l.lines = map[changeLineKey][]chan struct{}{}
	}
	l.lines[key] = append(line, turn)
	j.line, j.turn = key, turn
	return true
}

// wait returns once it is j's turn, or ctx's error if ctx ends first.
func (l *changeLines) wait(ctx context.Context, j *groupJob) error {
	select {
	case <-j.turn:
		return nil
	default:
	}
	l.waiting.Add(1)
	defer l.waiting.Add(-1)
	select {
	case <-j.turn:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// leave takes j out of its line, after its turn or instead of it, and
// gives the next change its turn if j had it.
func (l *changeLines) leave(j *groupJob) {
	l.mu.Lock()
	defer l.mu.Unlock()
	line := l.lines[j.line]
	for i, turn := range line {
		if turn != j.turn {
			continue
		}
		line = append(line[:i], line[i+1:]...)
		if i == 0 && len(line) > 0 {
			close(line[0])
		}
		break
	}
	if len(line) == 0 {
		delete(l.lines, j.line)
	} else {
		l.lines[j.line] = line
	}
	j.turn = nil
}
