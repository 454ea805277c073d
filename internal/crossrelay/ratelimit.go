package crossrelay

import (
	"context"
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// PublishLimiter is the relay's publish rate limit, as the relay asks it.
type PublishLimiter interface {
	Allow(community uuid.UUID, pubkey string, now time.Time) (ok bool, retryAfter time.Duration)
}

// limiterTimeout bounds one shared decision; past it (or on any Redis
// error) the process decides alone.
const limiterTimeout = 500 * time.Millisecond

// takeToken is a token bucket kept in one Redis hash per (community,
// pubkey): t tokens as of a (milliseconds). It refills at ARGV[2] tokens per
// millisecond up to ARGV[3], takes one token if there is one, and returns
// {1, 0} or {0, milliseconds until a token}. The key expires once it would
// be full again, so idle publishers cost nothing.
var takeToken = redis.NewScript(`
local now = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local tokens = tonumber(redis.call('HGET', KEYS[1], 't'))
local at = tonumber(redis.call('HGET', KEYS[1], 'a'))
if tokens == nil or at == nil then
  tokens = burst
  at = now
end
if now > at then
  tokens = math.min(burst, tokens + (now - at) * rate)
  at = now
end
local ok = 0
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
  ok = 1
else
  wait = math.ceil((1 - tokens) / rate)
end
redis.call('HSET', KEYS[1], 't', tostring(tokens), 'a', tostring(at))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate) + 1000)
return {ok, wait}
`)

// SharedLimiter counts every process's publishes in one bucket per
// (community, pubkey) in Redis, under buzz:<community id>:rate:<pubkey>, so
// a client spread over several relay processes gets the limit once, not
// once per process.
type SharedLimiter struct {
	bus      *Bus
	client   *redis.Client
	perMilli float64
	burst    float64
	// fallback decides while Redis cannot: each process then limits alone,
	// as it does without Redis, rather than refusing or waving everyone
	// through.
	fallback PublishLimiter
}

// Limiter returns a SharedLimiter allowing burst events at once and
// perMinute sustained, on this bus's Redis.
func (b *Bus) Limiter(perMinute, burst int, fallback PublishLimiter) *SharedLimiter {
	return &SharedLimiter{bus: b, client: b.client, perMilli: float64(perMinute) / 60000, burst: float64(burst), fallback: fallback}
}

// RateKey is the Redis key of one publisher's bucket.
func RateKey(community uuid.UUID, pubkey string) string {
	return channelPrefix + community.String() + ":rate:" + pubkey
}

// Allow takes one token from the shared bucket of (community, pubkey).
func (l *SharedLimiter) Allow(community uuid.UUID, pubkey string, now time.Time) (bool, time.Duration) {
	if !l.bus.Hears() {
		// Known to be unreachable: decide at once rather than make every
		// publish wait out the timeout.
		return l.fallback.Allow(community, pubkey, now)
	}
	ctx, cancel := context.WithTimeout(context.Background(), limiterTimeout)
	defer cancel()
	res, err := takeToken.Run(ctx, l.client, []string{RateKey(community, pubkey)},
		now.UnixMilli(), l.perMilli, l.burst).Int64Slice()
	if err != nil || len(res) != 2 {
		return l.fallback.Allow(community, pubkey, now)
	}
	if res[0] == 1 {
		return true, 0
	}
	wait := time.Duration(res[1]) * time.Millisecond
	// Whole seconds, like the in-process limiter's answer.
	return false, time.Duration(math.Ceil(wait.Seconds())) * time.Second
}
