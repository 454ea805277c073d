package relay_test

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
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

// BenchmarkFanout1000 times one event reaching 1,000 live subscribers: all
// on the publisher's relay, then split over three relays sharing a database
// and a Redis (the publisher on the first). It reports the p50 and p99 of
// the time from sending EVENT until the last subscriber has read it.
//
//	go run ./internal/dbtest/withcluster -- go test -run '^$' -bench Fanout1000 ./internal/relay/
func BenchmarkFanout1000(b *testing.B) {
	const subscribers = 1000
	for _, relays := range []int{1, 3} {
		b.Run(fmt.Sprintf("relays=%d", relays), func(b *testing.B) {
			pool := dbtest.Pool(b)
			var rs []*relaytest.Relay
			if relays == 1 {
				rs = append(rs, relaytest.StartOn(b, pool))
			} else {
				url := dbtest.RedisURL(b)
				for range relays {
					rs = append(rs, relaytest.StartOn(b, pool, withRedis(url)))
				}
				waitRedis(b, "connected", rs...)
			}
			host := rs[0].Host
			publisher := rs[0].Dial(b, host)
			author := publisher.Auth(nil)
			subs := make([]*relaytest.Client, subscribers)
			for i := range subs {
				subs[i] = rs[i%relays].Dial(b, host)
				subs[i].Auth(nil)
				subs[i].Send("REQ", "live", map[string]any{"authors": []string{author.PublicKeyHex()}, "limit": 0})
				subs[i].Expect("EOSE")
			}
			samples := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				ev := publisher.Sign(1, fmt.Sprintf("n %d", i), nil, 0)
				var wg sync.WaitGroup
				var failed atomic.Int32
				start := time.Now()
				publisher.Send("EVENT", ev)
				for _, s := range subs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if _, err := s.TryNext(30 * time.Second); err != nil {
							failed.Add(1)
						}
					}()
				}
				wg.Wait()
				samples = append(samples, time.Since(start))
				if failed.Load() > 0 {
					b.Fatalf("%d subscribers did not receive the event", failed.Load())
				}
				publisher.Expect("OK")
			}
			b.StopTimer()
			slices.Sort(samples)
			b.ReportMetric(float64(samples[len(samples)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(samples[len(samples)*99/100].Microseconds()), "p99-µs")
		})
	}
}
