// Package replica routes reads to a streaming standby only when the
// standby session proves it holds what the read needs, and sends every
// other read, and every doubt, to the writer (docs/replica.md).
//
// The proof has three parts. On the writer, the probe (Probe) samples the
// open transactions and then advances the token in replica_heartbeat; each
// token it commits gets a wall: no channel row dated at or before the wall
// can still commit, because the created_at floor refuses it. On the reader,
// a routed read opens a REPEATABLE READ READ ONLY transaction whose first
// statement reads the token its snapshot holds (Router). The Ring, in
// between, remembers the recent tokens with their walls and times, so a
// lagging reader proves from an older entry.
package replica

import (
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Entry is one committed probe token.
type Entry struct {
	Token int64
	Epoch uuid.UUID
	// CommittedAt is this process's clock just before the token's write
	// was sent: the token is at least as old as this.
	CommittedAt time.Time
	// Wall: every channel row with created_at at or before it had
	// committed when the token did.
	Wall time.Time
}

// RingCapacity is how many tokens the ring keeps. With the default probe
// interval it spans a minute, longer than Staleness: a reader lagging up to
// the staleness limit still finds the entry its token proves.
const RingCapacity = 120

// Staleness is how old the newest entry may be before the ring counts as
// closed: a probe that stopped writing must not keep routing open.
const Staleness = 30 * time.Second

// The ring must outlast the staleness window at the default interval.
var _ = [1]struct{}{}[boolToInt(RingCapacity*DefaultProbeInterval > Staleness)-1]

func boolToInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Resolution failures.
var (
	// ErrEpochMismatch: the reader is on another timeline than the writer
	// the probe last wrote to (a restore or re-seed happened in between).
	ErrEpochMismatch = errors.New("reader epoch differs from the writer's")
	// ErrTokenBehind: the reader's token is older than every entry kept.
	ErrTokenBehind = errors.New("reader token is behind every retained probe token")
)

// Ring holds the probe's recent tokens, oldest first. Safe for concurrent use.
type Ring struct {
	mu      sync.Mutex
	entries []Entry
	epoch   uuid.UUID
	// high is the highest token recorded, kept when the ring is cleared or
	// the epoch changes: a writer restored while the probe was failing comes
	// back with a lower token, and that must still read as a regression. A
	// rotation adds one to the token, so on one timeline tokens only grow,
	// across epochs too, and a backup taken in an older epoch is caught.
	high int64
	// last is the latest entry's CommittedAt, kept when the ring is
	// cleared: the heartbeat age goes on growing while the probe fails.
	last time.Time
}

// NewRing returns an empty (closed) ring. Any first token is accepted.
func NewRing() *Ring { return &Ring{high: -1} }

// Record adds a committed token. It returns false, and clears the ring,
// when the token did not advance: the writer's heartbeat went backwards,
// and the caller must rotate the epoch before anything is proved again
// (Adopt the rotated entry).
func (r *Ring) Record(e Entry) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.Token <= r.high {
		r.entries = r.entries[:0]
		return false
	}
	if e.Epoch != r.epoch {
		r.entries, r.epoch = r.entries[:0], e.Epoch
	}
	r.push(e)
	return true
}

// Adopt clears the ring and starts it again from e (the first entry of a
// new epoch).
func (r *Ring) Adopt(e Entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.entries, r.epoch = r.entries[:0], e.Epoch
	r.push(e)
}

func (r *Ring) push(e Entry) {
	r.last, r.high = e.CommittedAt, e.Token
	if len(r.entries) == RingCapacity {
		copy(r.entries, r.entries[1:])
		r.entries = r.entries[:RingCapacity-1]
	}
	r.entries = append(r.entries, e)
}

// Clear closes the ring until the next Record.
func (r *Ring) Clear() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.entries = r.entries[:0]
}

// Newest is the latest entry, if the ring holds one no older than Staleness.
func (r *Ring) Newest(now time.Time) (Entry, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.entries) == 0 {
		return Entry{}, false
	}
	e := r.entries[len(r.entries)-1]
	if now.Sub(e.CommittedAt) > Staleness {
		return Entry{}, false
	}
	return e, true
}

// HeartbeatAge is the age of the latest token ever recorded, however old
// and even after the ring closed (for metrics); false before the first.
func (r *Ring) HeartbeatAge(now time.Time) (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last.IsZero() {
		return 0, false
	}
	return now.Sub(r.last), true
}

// Resolve returns the entry a reader that observed (token, epoch) proves:
// the newest retained entry whose token it has reached.
func (r *Ring) Resolve(token int64, epoch uuid.UUID) (Entry, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.entries) == 0 {
		return Entry{}, ErrTokenBehind
	}
	if epoch != r.epoch {
		return Entry{}, ErrEpochMismatch
	}
	for i := len(r.entries) - 1; i >= 0; i-- {
		if r.entries[i].Token <= token {
			return r.entries[i], nil
		}
	}
	return Entry{}, ErrTokenBehind
}
