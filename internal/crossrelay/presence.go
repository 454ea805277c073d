package crossrelay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/presence"
)

// presenceTimeout bounds one presence read or write; past it (or on any
// Redis error) the process uses its own memory.
const presenceTimeout = 500 * time.Millisecond

// rememberPresence keeps one channel's presence in one Redis hash, pubkey ->
// "<created_at>:<expires ms>:<event JSON>", so a REQ reads a channel in one
// HGETALL and filters expiry itself (exact, by the relay clock, where a
// per-key EXPIRE would be rounded by Redis and blind to a stubbed clock).
// A sorted set beside it holds each pubkey by its expiry, so a write drops
// the expired fields without reading the others: a script scanning the
// whole hash on every write held the single-threaded Redis for a time that
// grew with the channel (272 ms a write at 2,000 announcements).
// A third key counts the bytes of the hash's values: a presence REQ reads
// a channel's whole hash (HGETALL), which holds the single-threaded Redis
// for as long as it takes, so a channel keeps at most a bounded number of
// bytes however many announcements that is.
// Beside the channel's keys, three of the community's bound its presence
// across channels: each announcement ("<channel>:<pubkey>") by expiry, its
// bytes, and their sum. A write drops the community's expired
// announcements from the sum (their channel drops their fields at its own
// next write, or its hash expires), and refuses one that would pass the
// community's bound (-1), leaving the author's held announcement.
// KEYS: the hash, the expiry set, the byte count; the community's expiry
// set, sizes, byte count. ARGV: pubkey, created_at, expires ms, value,
// now ms, key lifetime ms, most announcements kept, most bytes kept,
// "<channel>:<pubkey>", most bytes the community keeps.
// A held, unexpired announcement with a newer created_at wins. A channel
// holding the most announcements keeps no new pubkey's (it was still
// delivered live); one holding the most
// bytes keeps no announcement that would pass them, and forgets the
// pubkey's held one, which it replaced. All the keys live for a while
// past the last write, so idle channels and communities cost nothing.
var rememberPresence = redis.NewScript(`
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then
  local created, expires = string.match(old, '^(%d+):(%d+):')
  if tonumber(expires) > tonumber(ARGV[5]) and tonumber(created) > tonumber(ARGV[2]) then
    return 0
  end
end
local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[5])
for _, member in ipairs(gone) do
  local size = redis.call('HGET', KEYS[5], member)
  if size then
    redis.call('DECRBY', KEYS[6], size)
    redis.call('HDEL', KEYS[5], member)
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', ARGV[5])
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[5])
for _, pubkey in ipairs(expired) do
  local size = redis.call('HSTRLEN', KEYS[1], pubkey)
  if size > 0 then
    redis.call('DECRBY', KEYS[3], size)
    redis.call('HDEL', KEYS[1], pubkey)
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[5])
-- Never below zero: keys written before a count existed give back bytes
-- the count never had.
local mine = tonumber(redis.call('HGET', KEYS[5], ARGV[9]) or '0')
local total = math.max(0, tonumber(redis.call('GET', KEYS[6]) or '0'))
if total - mine + #ARGV[4] > tonumber(ARGV[10]) then
  return -1
end
local held = redis.call('HSTRLEN', KEYS[1], ARGV[1])
if held == 0 and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[7]) then
  return 0
end
local bytes = math.max(0, tonumber(redis.call('GET', KEYS[3]) or '0'))
if bytes - held + #ARGV[4] > tonumber(ARGV[8]) then
  if held > 0 then
    redis.call('HDEL', KEYS[1], ARGV[1])
    redis.call('ZREM', KEYS[2], ARGV[1])
    redis.call('DECRBY', KEYS[3], held)
  end
  if mine > 0 then
    redis.call('HDEL', KEYS[5], ARGV[9])
    redis.call('ZREM', KEYS[4], ARGV[9])
    redis.call('SET', KEYS[6], total - mine)
  end
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('SET', KEYS[3], math.max(#ARGV[4], bytes - held + #ARGV[4]))
redis.call('HSET', KEYS[5], ARGV[9], #ARGV[4])
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[9])
redis.call('SET', KEYS[6], total - mine + #ARGV[4])
for i = 1, 6 do
  redis.call('PEXPIRE', KEYS[i], ARGV[6])
end
return 1
`)

// PresenceKey is the Redis hash of one channel's presence.
func PresenceKey(community, channel uuid.UUID) string {
	return channelPrefix + community.String() + ":presence:" + channel.String()
}

// presenceExpiryKey is the sorted set of one channel's presence pubkeys by
// expiry.
func presenceExpiryKey(community, channel uuid.UUID) string {
	return PresenceKey(community, channel) + ":expires"
}

// presenceBytesKey counts the bytes of one channel's presence hash values.
func presenceBytesKey(community, channel uuid.UUID) string {
	return PresenceKey(community, channel) + ":bytes"
}

// presenceCommunityKey prefixes the community's keys that bound its
// presence across channels.
func presenceCommunityKey(community uuid.UUID) string {
	return channelPrefix + community.String() + ":presence-total"
}

// SharedPresence keeps presence in Redis, so an announcement accepted by
// any process is seen by a REQ on any other.
type SharedPresence struct {
	bus    *Bus
	client *redis.Client
	ttl    time.Duration
	max    int // announcements kept per channel
	// maxBytes bounds the bytes of one channel's hash values.
	maxBytes int
	// maxCommunityBytes bounds them across a community's channels.
	maxCommunityBytes int
	// fallback answers while Redis cannot: each process then knows the
	// presence it accepted itself, as without Redis.
	fallback presence.Store
	// behind says Redis may lack announcements the fallback holds (those
	// in keptHere, or all of them when lostAll). KeepRestored writes them
	// back.
	behind atomic.Bool

	mu sync.Mutex
	// keptHere is the announcements kept only in the fallback since the
	// last write-back: after a failed write only they are missing from
	// Redis. Writing back the whole store instead cost Redis 2.7 s of CPU
	// at 100,000 announcements, for each failed write of one.
	keptHere map[heldKey]struct{}
	// lostAll says Redis may lack every announcement held: it is a Redis
	// this process has not written them to (restarted, or another one).
	lostAll bool
}

// heldKey names one held announcement: its author's in a channel.
type heldKey struct {
	community, channel uuid.UUID
	pubkey             string
}

// maxKeptHere bounds keptHere: past it, the whole store is written back,
// which then costs about as much.
const maxKeptHere = 4096

// keptOnlyHere notes that the fallback holds an announcement Redis lacks;
// called after the fallback holds it, so a write-back that clears this
// mark reads the store after it.
func (p *SharedPresence) keptOnlyHere(community, channel uuid.UUID, pubkey string) {
	p.mu.Lock()
	if !p.lostAll {
		if len(p.keptHere) >= maxKeptHere {
			p.lostAll, p.keptHere = true, nil
		} else {
			if p.keptHere == nil {
				p.keptHere = map[heldKey]struct{}{}
			}
			p.keptHere[heldKey{community, channel, pubkey}] = struct{}{}
		}
	}
	p.mu.Unlock()
	p.behind.Store(true)
}

// redisLost notes that Redis may lack every announcement held.
func (p *SharedPresence) redisLost() {
	p.mu.Lock()
	p.lostAll, p.keptHere = true, nil
	p.mu.Unlock()
	p.behind.Store(true)
}

// takeMissing takes what Redis may lack, for one write-back; giveBack
// returns it when the write-back failed.
func (p *SharedPresence) takeMissing() (all bool, some map[heldKey]struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	all, some = p.lostAll, p.keptHere
	p.lostAll, p.keptHere = false, nil
	return all, some
}

func (p *SharedPresence) giveBack(all bool, some map[heldKey]struct{}) {
	if all {
		p.redisLost()
		return
	}
	for k := range some {
		p.keptOnlyHere(k.community, k.channel, k.pubkey)
	}
}

// Presence returns a presence store on this bus's Redis keeping
// announcements for ttl, at most max and maxBytes of them per channel, and
// maxCommunityBytes of them per community.
func (b *Bus) Presence(ttl time.Duration, max, maxBytes, maxCommunityBytes int, fallback presence.Store) *SharedPresence {
	p := &SharedPresence{bus: b, client: b.client, ttl: ttl, max: max, maxBytes: maxBytes,
		maxCommunityBytes: maxCommunityBytes, fallback: fallback}
	b.presence.Store(p)
	return p
}

// Remember implements presence.Store: Redis's answer, or the process's own
// store's while Redis cannot answer.
// What Redis keeps the process keeps too, for an outage; what Redis
// refuses it does not.
func (p *SharedPresence) Remember(community, channel uuid.UUID, ev *nostr.Event, now time.Time) error {
	if !p.bus.Hears() {
		return p.keepOnlyHere(community, channel, ev, now)
	}
	ctx, cancel := context.WithTimeout(context.Background(), presenceTimeout)
	defer cancel()
	keys, args := p.remembering(community, channel, ev.PubKey, ev.CreatedAt, now.Add(p.ttl), ev.AppendJSON(nil), now)
	kept, err := rememberPresence.Run(ctx, p.client, keys, args...).Int()
	switch {
	case err != nil:
		return p.keepOnlyHere(community, channel, ev, now)
	case kept < 0:
		return presence.ErrFull
	}
	_ = p.fallback.Remember(community, channel, ev, now) // Redis's answer holds
	return nil
}

// keepOnlyHere keeps an announcement Redis could not take in the
// fallback, for the next write-back.
func (p *SharedPresence) keepOnlyHere(community, channel uuid.UUID, ev *nostr.Event, now time.Time) error {
	err := p.fallback.Remember(community, channel, ev, now)
	if err == nil {
		p.keptOnlyHere(community, channel, ev.PubKey)
	}
	return err
}

// remembering is the keys and arguments of rememberPresence for one
// announcement kept until expires.
func (p *SharedPresence) remembering(community, channel uuid.UUID, pubkey string, createdAt int64, expires time.Time, eventJSON []byte, now time.Time) ([]string, []any) {
	value := strconv.FormatInt(createdAt, 10) + ":" + strconv.FormatInt(expires.UnixMilli(), 10) + ":" + string(eventJSON)
	// The hash outlives its newest field by a TTL: a reader whose clock
	// runs a little behind the writer's still finds it.
	lifetime := (2 * p.ttl).Milliseconds()
	total := presenceCommunityKey(community)
	keys := []string{PresenceKey(community, channel), presenceExpiryKey(community, channel), presenceBytesKey(community, channel),
		total + ":expires", total + ":sizes", total + ":bytes"}
	return keys, []any{pubkey, createdAt, expires.UnixMilli(), value, now.UnixMilli(), lifetime,
		p.max, p.maxBytes, channel.String() + ":" + pubkey, p.maxCommunityBytes}
}

// restoreBatch is how many announcements one round trip writes back.
const restoreBatch = 256

// ClosedAmong says which of the given communities are no longer served
// (being deleted, or archived).
type ClosedAmong func(ctx context.Context, communities []uuid.UUID) (map[uuid.UUID]bool, error)

// Restore writes back to Redis the unexpired announcements this process
// holds that Redis may lack, each under its own expiry, and returns how
// many it sent (KeepRestored runs it when there are any): those the
// process kept only here while it could not write to Redis, or all of
// them once it subscribed to a Redis that restarted (a restarted Redis
// may be empty), so a REQ on any process (this one included, which reads
// Redis again) found nobody present until each author announced again,
// up to a TTL later. Written by the same script as an announcement: a
// newer one held in Redis wins, and the channel's and community's bounds
// hold. The announcements of the communities closed names are left out: a
// deletion removes a community's keys from Redis, and written back they
// would outlive it. A failed write-back leaves all it took to the next.
func (p *SharedPresence) Restore(ctx context.Context, now time.Time, closed ClosedAmong) (sent int, err error) {
	local, ok := p.fallback.(interface {
		Unexpired(now time.Time) []presence.Announcement
	})
	if !ok {
		return 0, nil
	}
	all, some := p.takeMissing()
	defer func() {
		if err != nil {
			p.giveBack(all, some)
		}
	}()
	held := local.Unexpired(now)
	if !all {
		held = slices.DeleteFunc(held, func(a presence.Announcement) bool {
			_, missing := some[heldKey{a.Community, a.Channel, a.PubKey}]
			return !missing
		})
	}
	if len(held) == 0 {
		return 0, nil
	}
	seen := map[uuid.UUID]bool{}
	var communities []uuid.UUID
	for _, a := range held {
		if !seen[a.Community] {
			seen[a.Community] = true
			communities = append(communities, a.Community)
		}
	}
	gone, err := closed(ctx, communities)
	if err != nil {
		return 0, err
	}
	held = slices.DeleteFunc(held, func(a presence.Announcement) bool { return gone[a.Community] })
	if len(held) == 0 {
		return 0, nil
	}
	// A pipeline cannot fall back from EVALSHA to EVAL: load the script
	// first (a Redis restarted empty has forgotten it).
	lctx, cancel := context.WithTimeout(ctx, presenceTimeout)
	defer cancel()
	if err := rememberPresence.Load(lctx, p.client).Err(); err != nil {
		return 0, err
	}
	for len(held) > 0 {
		batch := held[:min(restoreBatch, len(held))]
		held = held[len(batch):]
		bctx, cancel := context.WithTimeout(ctx, presenceTimeout)
		pipe := p.client.Pipeline()
		for _, a := range batch {
			keys, args := p.remembering(a.Community, a.Channel, a.PubKey, a.CreatedAt, a.Expires, a.JSON, now)
			rememberPresence.EvalSha(bctx, pipe, keys, args...)
		}
		_, err = pipe.Exec(bctx)
		cancel()
		if err != nil {
			return sent, err
		}
		sent += len(batch)
		p.bus.metrics.PresenceWrittenBack.Add(float64(len(batch)))
	}
	return sent, nil
}

// restoreEvery is how often KeepRestored looks whether Redis lacks
// presence this process holds.
const restoreEvery = 250 * time.Millisecond

// maxRestoreWait is the most looks KeepRestored lets pass after failed
// write-backs (8 s): after each failure it waits twice as many as after
// the one before. Trying again at every look, a Redis refusing writes
// (full, with noeviction) or a database not answering the closed
// communities got a write-back and a query four times a second from every
// process for as long as it lasted.
const maxRestoreWait = 32

// KeepRestored runs until ctx ends: whenever Redis may lack announcements
// this process holds and the bus hears Redis again, it writes them back
// (Restore), by the relay's clock now.
func (p *SharedPresence) KeepRestored(ctx context.Context, now func() time.Time, closed ClosedAmong) {
	tick := time.NewTicker(restoreEvery)
	defer tick.Stop()
	p.keepRestored(ctx, tick.C, now, closed)
}

// keepRestored is KeepRestored looking at each of looks.
func (p *SharedPresence) keepRestored(ctx context.Context, looks <-chan time.Time, now func() time.Time, closed ClosedAmong) {
	failing := false
	wait, skip := 0, 0 // looks to let pass after a failure, and still to
	for {
		select {
		case <-ctx.Done():
			return
		case <-looks:
		}
		if skip > 0 {
			skip--
			continue
		}
		// Cleared before Restore takes what is missing: an announcement
		// kept only here after that marks it again.
		if !p.bus.Hears() || !p.behind.Swap(false) {
			continue
		}
		sent, err := p.Restore(ctx, now(), closed)
		if err != nil { // Restore marked what it did not write back
			if !failing && ctx.Err() == nil {
				p.bus.log.Warn("redis: could not write back the presence this process holds; trying again", "err", err, "written", sent)
			}
			failing = true
			p.bus.metrics.PresenceWriteBackFailures.Inc()
			wait = min(max(1, 2*wait), maxRestoreWait)
			skip = wait
			continue
		}
		if sent > 0 {
			p.bus.log.Info("redis: wrote back the presence this process holds", "announcements", sent)
		}
		failing, wait = false, 0
	}
}

// Current implements presence.Store.
func (p *SharedPresence) Current(ctx context.Context, community, channel uuid.UUID, now time.Time) []*nostr.Event {
	if !p.bus.Hears() {
		return p.fallback.Current(ctx, community, channel, now)
	}
	ctx, cancel := context.WithTimeout(ctx, presenceTimeout)
	defer cancel()
	fields, err := p.client.HGetAll(ctx, PresenceKey(community, channel)).Result()
	if err != nil {
		return p.fallback.Current(ctx, community, channel, now)
	}
	var out []*nostr.Event
	for _, value := range fields {
		_, rest, ok := strings.Cut(value, ":")
		if !ok {
			continue
		}
		expiresText, eventJSON, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		expires, err := strconv.ParseInt(expiresText, 10, 64)
		if err != nil || expires <= now.UnixMilli() {
			continue
		}
		var ev nostr.Event
		if json.Unmarshal([]byte(eventJSON), &ev) == nil {
			out = append(out, &ev)
		}
	}
	return out
}

// Held implements presence.Store: one round trip for the whole batch.
func (p *SharedPresence) Held(ctx context.Context, community uuid.UUID, wants []presence.Want, now time.Time) [][]byte {
	if !p.bus.Hears() {
		return p.fallback.Held(ctx, community, wants, now)
	}
	ctx, cancel := context.WithTimeout(ctx, presenceTimeout)
	defer cancel()
	pipe := p.client.Pipeline()
	gets := make([]*redis.StringCmd, len(wants))
	for i, w := range wants {
		gets[i] = pipe.HGet(ctx, PresenceKey(community, w.Channel), w.PubKey)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return p.fallback.Held(ctx, community, wants, now)
	}
	out := make([][]byte, len(wants))
	for i, get := range gets {
		value, err := get.Bytes()
		if err != nil {
			continue
		}
		// "<created_at>:<expires ms>:<event JSON>"
		_, rest, ok := bytes.Cut(value, []byte(":"))
		if !ok {
			continue
		}
		expiresText, eventJSON, ok := bytes.Cut(rest, []byte(":"))
		if !ok {
			continue
		}
		expires, err := strconv.ParseInt(string(expiresText), 10, 64)
		// The JSON goes to the client as it is: whatever else wrote the
		// key must not break the client's framing.
		if err == nil && expires > now.UnixMilli() && json.Valid(eventJSON) {
			out[i] = eventJSON
		}
	}
	return out
}
