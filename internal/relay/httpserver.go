package relay

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// headerTimeout bounds the headers alone, so a client trickling them is
// dropped well before the whole-request budget.
const headerTimeout = 10 * time.Second

// HTTPServer is the public listener's server: Handler with every timeout
// set, so a client can hold neither a slow request (headers and body must
// arrive within HTTPReadTimeout), nor a slow response, nor an idle
// keep-alive connection. An upgraded WebSocket leaves these deadlines
// behind and is bounded by its own (AUTH deadline, pings, write watchdog).
func (s *Server) HTTPServer() *http.Server {
	return &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: min(headerTimeout, s.cfg.HTTPReadTimeout),
		ReadTimeout:       s.cfg.HTTPReadTimeout,
		WriteTimeout:      s.cfg.HTTPWriteTimeout,
		IdleTimeout:       s.cfg.HTTPIdleTimeout,
	}
}

// MetricsHandler serves /metrics. It is kept off the public handler: the
// numbers describe every community on this relay, so they belong on an
// operator-only address (BUZZ_METRICS_ADDR), not on each community's host.
func (s *Server) MetricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.Registry, promhttp.HandlerOpts{}))
	return mux
}

// MetricsServer is the operator listener's server for MetricsHandler.
func (s *Server) MetricsServer() *http.Server {
	return &http.Server{
		Handler:           s.MetricsHandler(),
		ReadHeaderTimeout: headerTimeout,
		ReadTimeout:       s.cfg.HTTPReadTimeout,
		WriteTimeout:      s.cfg.HTTPWriteTimeout,
		IdleTimeout:       s.cfg.HTTPIdleTimeout,
	}
}
