package doorbell

import (
	"container/list"
	"sort"
	"sync"
	"time"
)

// seenCauses remembers the signed causes already verified, keyed on
// (definition event id, cause type, cause value, step), so that a relay
// replaying a doorbell, or issuing a second one for the same cause and
// step, wakes the agent once. It lives in memory; a runtime that keeps it
// across restarts seeds it with Options.Spent. It is bounded both ways: at most max entries (the
// least recently seen goes first) and each for at most ttl.
type seenCauses struct {
	mu    sync.Mutex
	max   int
	ttl   time.Duration
	order *list.List // front = most recent; values are *seenEntry
	index map[string]*list.Element
}

type seenEntry struct {
	key  string
	seen time.Time
}

func newSeenCauses(max int, ttl time.Duration) *seenCauses {
	return &seenCauses{max: max, ttl: ttl, order: list.New(), index: map[string]*list.Element{}}
}

// has reports whether key was recorded and has not expired.
func (s *seenCauses) has(key string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.liveLocked(key, now)
}

func (s *seenCauses) liveLocked(key string, now time.Time) bool {
	el, ok := s.index[key]
	if !ok {
		return false
	}
	if now.Sub(el.Value.(*seenEntry).seen) >= s.ttl {
		s.order.Remove(el)
		delete(s.index, key)
		return false
	}
	return true
}

// add records key unless it is already live; it reports whether it did.
func (s *seenCauses) add(key string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.liveLocked(key, now) {
		return false
	}
	s.index[key] = s.order.PushFront(&seenEntry{key: key, seen: now})
	for s.order.Len() > s.max {
		oldest := s.order.Back()
		s.order.Remove(oldest)
		delete(s.index, oldest.Value.(*seenEntry).key)
	}
	return true
}

// preload records keys spent by an earlier process, oldest first so the
// bound forgets the oldest; those already expired are left out.
func (s *seenCauses) preload(spent map[string]time.Time, now time.Time) {
	keys := make([]string, 0, len(spent))
	for k, at := range spent {
		if now.Sub(at) < s.ttl {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return spent[keys[i]].Before(spent[keys[j]]) })
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		if _, dup := s.index[k]; !dup {
			s.index[k] = s.order.PushFront(&seenEntry{key: k, seen: spent[k]})
		}
	}
	for s.order.Len() > s.max {
		oldest := s.order.Back()
		s.order.Remove(oldest)
		delete(s.index, oldest.Value.(*seenEntry).key)
	}
}

// webhookBuckets are token buckets, one per workflow coordinate (owner and
// workflow id), that bound how often webhook doorbells may wake the agent:
// a webhook has no signed source, so anyone holding the secret could
// otherwise drive the agent as fast as the relay runs. Keying on the
// coordinate rather than the definition revision means re-saving the
// workflow does not refill its budget.
type webhookBuckets struct {
	mu      sync.Mutex
	burst   float64
	refill  time.Duration // one token per refill
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

// maxIdleBuckets bounds the map: beyond it, full buckets (which behave
// exactly like absent ones) are forgotten.
const maxIdleBuckets = 4096

func newWebhookBuckets(burst int, refill time.Duration) *webhookBuckets {
	return &webhookBuckets{burst: float64(burst), refill: refill, buckets: map[string]*bucket{}}
}

func (w *webhookBuckets) levelLocked(b *bucket, now time.Time) float64 {
	elapsed := now.Sub(b.at)
	if elapsed <= 0 {
		return b.tokens
	}
	return min(w.burst, b.tokens+float64(elapsed)/float64(w.refill))
}

// allows reports whether key has a token left now, without taking it.
func (w *webhookBuckets) allows(key string, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	b, ok := w.buckets[key]
	return !ok || w.levelLocked(b, now) >= 1
}

// take spends one of key's tokens; it reports false when none is left.
func (w *webhookBuckets) take(key string, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	b, ok := w.buckets[key]
	if !ok {
		if len(w.buckets) >= maxIdleBuckets {
			w.forgetFullLocked(now)
		}
		b = &bucket{tokens: w.burst, at: now}
		w.buckets[key] = b
	}
	level := w.levelLocked(b, now)
	if level < 1 {
		return false
	}
	b.tokens, b.at = level-1, now
	return true
}

func (w *webhookBuckets) forgetFullLocked(now time.Time) {
	for k, b := range w.buckets {
		if w.levelLocked(b, now) >= w.burst {
			delete(w.buckets, k)
		}
	}
}
