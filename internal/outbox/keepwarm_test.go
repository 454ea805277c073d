package outbox

import (
	"context"
	"crypto/x509"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// A listener that closes connections idle for a second still gets its
// mention on the connection the deliverer opened at start-up: the
// keep-alive HEADs never let it sit idle that long. Over HTTP/1.1 and
// HTTP/2 alike.
// Mutations killed: KeepWarm not warming at start (no HEAD before the
// first mention); KeepWarm warming only at start (the listener closes the
// idle connection and the mention opens a second one).
func TestKeepWarmHoldsTheListenerConnectionOpen(t *testing.T) {
	t.Parallel()
	for name, h2 := range map[string]bool{"http1": false, "http2": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			var heads, posts, conns atomic.Int32
			var proto atomic.Value
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				proto.Store(r.Proto)
				switch r.Method {
				case http.MethodHead:
					heads.Add(1)
					w.WriteHeader(http.StatusMethodNotAllowed) // a listener may refuse it: the connection is what counts
				case http.MethodPost:
					posts.Add(1)
				}
			}))
			const listenerIdleTimeout = time.Second
			srv.EnableHTTP2 = h2
			srv.Config.IdleTimeout = listenerIdleTimeout
			srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
				if s == http.StateNew {
					conns.Add(1)
				}
			}
			srv.StartTLS()
			t.Cleanup(srv.Close)
			cas := x509.NewCertPool()
			cas.AddCert(srv.Certificate())

			listener := newPubkey(t)
			target := newPubkey(t)
			routes := Routes{listener: srv.URL + "/hooks/buzz"}
			m, err := NewMetrics(prometheus.NewRegistry())
			require.NoError(t, err)
			relayKey, _ := newKey(t)
			d := NewDeliverer(f.pool, Config{Listeners: routes, Timeout: 5 * time.Second, KeepWarm: 250 * time.Millisecond},
				relayKey, m, WithRootCAs(cas), WithLogger(slog.New(slog.DiscardHandler)))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go d.KeepWarm(ctx)
			require.Eventually(t, func() bool { return heads.Load() >= 1 }, 30*time.Second, 10*time.Millisecond,
				"the listener got no keep-alive before the first mention")

			// Long enough for the listener to close an idle connection
			// twice over.
			time.Sleep(3 * listenerIdleTimeout)
			w := NewWorker(f.pool, routes, d)
			go w.Run(ctx)
			f.register(listener, target)
			f.save(message(t, 9, target), w, true)
			require.Eventually(t, func() bool { return posts.Load() == 1 }, 30*time.Second, 10*time.Millisecond)
			require.EqualValues(t, 1, conns.Load(), "the mention went over the connection opened at start-up")
			want := "HTTP/1.1"
			if h2 {
				want = "HTTP/2.0"
			}
			require.Equal(t, want, proto.Load())
		})
	}
}
