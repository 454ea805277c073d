package relay

import (
	"container/list"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
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
// (community, pubkey) holding up to burst tokens, refilled at perMinute. A
// bucket refilled to its burst is what a new one would be, so it is
// forgotten: what is kept follows the keys active within the last
// burst/rate, not every key ever seen. At most maxKeys buckets are kept;
// past that the least recently used goes first, which at worst hands an
// idle key a full bucket again.
type TokenBuckets struct {
	mu      sync.Mutex
	perSec  float64
	burst   float64
	maxKeys int
	lru     *list.List // of *keyedBucket, most recently used first
	byKey   map[bucketKey]*list.Element
}

type bucketKey struct {
	community uuid.UUID
	pubkey    string
}

type keyedBucket struct {
	key bucketKey
	tokenBucket
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
	l.forgetRefilled(now)
	key := bucketKey{community, pubkey}
	var b *keyedBucket
	if el, ok := l.byKey[key]; ok {
		l.lru.MoveToFront(el)
		b = el.Value.(*keyedBucket)
	} else {
		if l.lru.Len() >= l.maxKeys {
			oldest := l.lru.Back()
			delete(l.byKey, oldest.Value.(*keyedBucket).key)
			l.lru.Remove(oldest)
		}
		b = &keyedBucket{key: key, tokenBucket: tokenBucket{tokens: l.burst, at: now}}
		l.byKey[key] = l.lru.PushFront(b)
	}
	wait, ok := b.take(now, l.perSec, l.burst)
	if ok {
		return true, 0
	}
	return false, retryWithin(wait)
}

// Peek says what Allow would answer at now, taking no token and keeping
// no bucket: a key without one has a full bucket.
func (l *TokenBuckets) Peek(community uuid.UUID, pubkey string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := tokenBucket{tokens: l.burst, at: now}
	if el, ok := l.byKey[bucketKey{community, pubkey}]; ok {
		b = el.Value.(*keyedBucket).tokenBucket // a copy: peeking refills nothing
	}
	wait, ok := b.take(now, l.perSec, l.burst)
	if ok {
		return true, 0
	}
	return false, retryWithin(wait)
}

// retryWithin is the wait a refusal names: the next token's, rounded to
// the second and one more, so that a client retrying then finds it.
func retryWithin(wait time.Duration) time.Duration {
	return wait.Round(time.Second) + time.Second
}

// forgetRefilled drops the least recently used buckets that are full by
// now, stopping at the first that is not: each call looks at one bucket
// more than it drops.
func (l *TokenBuckets) forgetRefilled(now time.Time) {
	for el := l.lru.Back(); el != nil; el = l.lru.Back() {
		b := el.Value.(*keyedBucket)
		if b.tokens+now.Sub(b.at).Seconds()*l.perSec < l.burst {
			return
		}
		delete(l.byKey, b.key)
		l.lru.Remove(el)
	}
}

// Len is the number of buckets held.
func (l *TokenBuckets) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lru.Len()
}

// addressCommunity is the community that buckets counted per client
// address are kept under (bad HTTP signatures, handshakes): they count per
// address, whatever the community.
var addressCommunity = uuid.Nil

// tokenBucket holds up to burst tokens, refilled at rate a second; alone,
// it is one connection's, used by one goroutine at a time.
type tokenBucket struct {
	tokens float64
	at     time.Time
}

// take takes a token at now if there is one; else it says how long until
// there is.
func (b *tokenBucket) take(now time.Time, rate, burst float64) (wait time.Duration, ok bool) {
	if elapsed := now.Sub(b.at).Seconds(); elapsed > 0 {
		b.tokens = min(burst, b.tokens+elapsed*rate)
		b.at = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return 0, true
	}
	return time.Duration((1 - b.tokens) / rate * float64(time.Second)), false
}

// AUTH signature checks a connection may have: authChecksAtOnce, then one
// every authCheckEvery. Verifying a signature costs the relay tens of
// microseconds and the client nothing, since one message may be sent again
// and again: unbounded, a few connections kept a core busy verifying. Per
// connection, not per address: an address's bucket let one connection of
// it, unauthenticated, refuse AUTH to everyone behind that address, in
// every community; the connection caps bound an address to
// MaxConnectionsPerAddr of these (50 a second, 2 ms of CPU). Ten at once
// leave room for a client that authenticates several keys, or retries an
// agent's owner attestation, on one connection.
const (
	authChecksAtOnce = 10
	authCheckEvery   = time.Second
)

// rateLimitedReason is the rejection a refused publish gets.
func rateLimitedReason(retryAfter time.Duration) string {
	return fmt.Sprintf("rate-limited: publishing too fast; try again in %s", retryAfter)
}

// giveBack returns a token Allow took from (community, pubkey)'s bucket, up
// to the burst: the thing it was taken for turned out not to count.
func (l *TokenBuckets) giveBack(community uuid.UUID, pubkey string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if el, ok := l.byKey[bucketKey{community, pubkey}]; ok {
		b := el.Value.(*keyedBucket)
		b.tokens = min(l.burst, b.tokens+1)
	}
}
