package relay

import (
	"container/list"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/config"
)

// PublishLimiter decides whether pubkey may publish one more event in
// community at now; when not, retryAfter says how long until it may. It
// covers every publish path (WebSocket EVENT and POST /events). The
// in-process TokenBuckets limits per relay process; a shared store can
// implement the same interface to limit across processes.
type PublishLimiter interface {
	Allow(community uuid.UUID, pubkey string, now time.Time) (ok bool, retryAfter time.Duration)
}

// TokenBuckets is an in-process PublishLimiter: one token bucket per
// (community, pubkey) holding up to burst tokens, refilled at perMinute. At
// most maxKeys buckets are kept; the least recently used goes first, which
// at worst hands an idle publisher a full bucket again.
type TokenBuckets struct {
	mu      sync.Mutex
	perSec  float64
	burst   float64
	maxKeys int
	lru     *list.List // of *tokenBucket, most recently used first
	byKey   map[bucketKey]*list.Element
}

type bucketKey struct {
	community uuid.UUID
	pubkey    string
}

type tokenBucket struct {
	key    bucketKey
	tokens float64
	at     time.Time // when tokens was last brought up to date
}

// NewTokenBuckets returns a limiter allowing burst events at once and
// perMinute sustained, per (community, pubkey), over at most maxKeys keys.
func NewTokenBuckets(perMinute, burst, maxKeys int) *TokenBuckets {
	return &TokenBuckets{
		perSec:  float64(perMinute) / 60,
		burst:   float64(burst),
		maxKeys: max(maxKeys, 1),
		lru:     list.New(),
		byKey:   map[bucketKey]*list.Element{},
	}
}

// Allow takes one token from the caller's bucket if it has one.
func (l *TokenBuckets) Allow(community uuid.UUID, pubkey string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	key := bucketKey{community, pubkey}
	var b *tokenBucket
	if el, ok := l.byKey[key]; ok {
		l.lru.MoveToFront(el)
		b = el.Value.(*tokenBucket)
		if elapsed := now.Sub(b.at).Seconds(); elapsed > 0 {
			b.tokens = math.Min(l.burst, b.tokens+elapsed*l.perSec)
			b.at = now
		}
	} else {
		if l.lru.Len() >= l.maxKeys {
			oldest := l.lru.Back()
			delete(l.byKey, oldest.Value.(*tokenBucket).key)
			l.lru.Remove(oldest)
		}
		b = &tokenBucket{key: key, tokens: l.burst, at: now}
		l.byKey[key] = l.lru.PushFront(b)
	}
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	wait := time.Duration((1 - b.tokens) / l.perSec * float64(time.Second))
	return false, wait.Round(time.Second) + time.Second
}

// Len is the number of buckets held.
func (l *TokenBuckets) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lru.Len()
}

// newAuthVerifications returns the buckets of AUTH signature verifications,
// one per client address (as the connection caps count it; the community is
// uuid.Nil, since the CPU spent is the process's). Verifying a signature
// costs the relay tens of microseconds; a client may send the same AUTH
// message again and again for nothing, so unbounded, a few connections kept
// a core busy verifying. Every connection an address may hold can
// authenticate at once (the burst, MaxConnectionsPerAddr), and each again
// every ten seconds, sustained.
func newAuthVerifications(cfg config.Config) *TokenBuckets {
	return NewTokenBuckets(6*cfg.MaxConnectionsPerAddr, cfg.MaxConnectionsPerAddr, cfg.RateLimitKeys)
}

// rateLimitedReason is the rejection a refused publish gets.
func rateLimitedReason(retryAfter time.Duration) string {
	return fmt.Sprintf("rate-limited: publishing too fast; try again in %s", retryAfter)
}
