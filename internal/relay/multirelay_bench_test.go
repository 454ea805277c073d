package relay_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// BenchmarkLiveDeliveryLatency times publish to live delivery: a publisher
// and a subscriber on one relay, then on two relays sharing a database and
// a Redis. It reports the p50 and p99 of the time from sending EVENT to
// the subscriber reading it (the OK is read after).
//
//	go run ./internal/dbtest/withcluster -- go test -run '^$' -bench LiveDeliveryLatency ./internal/relay/
func BenchmarkLiveDeliveryLatency(b *testing.B) {
	for _, cross := range []bool{false, true} {
		name := "single-relay"
		if cross {
			name = "cross-relay"
		}
		b.Run(name, func(b *testing.B) {
			pool := dbtest.Pool(b)
			url := dbtest.RedisURL(b)
			a := relaytest.StartOn(b, pool) // today's single relay: no Redis
			pubRelay := a
			if cross {
				a = relaytest.StartOn(b, pool, withRedis(url))
				pubRelay = relaytest.StartOn(b, pool, withRedis(url))
				waitRedis(b, "connected", a, pubRelay)
			}
			sub := a.Dial(b, a.Host)
			sub.Auth(nil)
			publisher := pubRelay.Dial(b, a.Host)
			author := publisher.Auth(nil)
			sub.Send("REQ", "live", map[string]any{"authors": []string{author.PublicKeyHex()}, "limit": 0})
			sub.Expect("EOSE")
			samples := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				ev := publisher.Sign(1, fmt.Sprintf("n %d", i), nil, 0)
				start := time.Now()
				publisher.Send("EVENT", ev)
				if got := sub.Expect("EVENT").Event.ID; got != ev.ID {
					b.Fatalf("got %s, want %s", got, ev.ID)
				}
				samples = append(samples, time.Since(start))
				publisher.Expect("OK")
			}
			b.StopTimer()
			slices.Sort(samples)
			b.ReportMetric(float64(samples[len(samples)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(samples[len(samples)*99/100].Microseconds()), "p99-µs")
		})
	}
}
