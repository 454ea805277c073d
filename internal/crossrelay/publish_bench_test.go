package crossrelay

import (
	"context"
	"io"
	"log/slog"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
)

// BenchmarkPublishEvent is what ingest's OnPublish costs the publishing
// goroutine, which runs it before the local fan-out (ingest.Pipeline.publish):
// the event's encoding and a queue send that never waits. Redis answering,
// and Redis stalled (stopped) with the queue full (every publish dropped
// and counted), must cost the same order: a stalled Redis must not hold up
// local subscribers.
func BenchmarkPublishEvent(b *testing.B) {
	for _, stalled := range []bool{false, true} {
		name := "redis_answering"
		if stalled {
			name = "redis_stalled_queue_full"
		}
		b.Run(name, func(b *testing.B) {
			srv := dbtest.RedisServer(b)
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			const queue = 10_000 // the default BUZZ_REDIS_PUBLISH_QUEUE
			bus, err := New(srv.URL(), queue, Handlers{}, log, NewMetrics(prometheus.NewRegistry()))
			require.NoError(b, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { bus.Run(ctx); close(done) }()
			b.Cleanup(func() { cancel(); <-done })
			deadline := time.Now().Add(30 * time.Second)
			for !bus.Hears() && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			require.True(b, bus.Hears())
			ev := signed(b, "a message of ordinary length, as a chat sends it")
			community, channel := uuid.New(), uuid.New()
			if stalled {
				require.NoError(b, syscall.Kill(srv.Pid(), syscall.SIGSTOP))
				b.Cleanup(func() { _ = syscall.Kill(srv.Pid(), syscall.SIGCONT) })
				for range 2 * queue { // the sender takes some before it blocks on Redis
					bus.PublishEvent(community, ev, &channel, 1)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				bus.PublishEvent(community, ev, &channel, 1)
			}
		})
	}
}
