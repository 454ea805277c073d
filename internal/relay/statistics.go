package relay

import "context"

// KeepEventStatistics analyzes the events table after a burst outgrows its
// planner statistics (eventstore.AnalyzeWhenStale), until ctx ends; off
// when BUZZ_EVENTS_ANALYZE_INTERVAL_MS is 0.
func (s *Server) KeepEventStatistics(ctx context.Context) {
	if s.cfg.EventsAnalyzeInterval <= 0 {
		return
	}
	s.store.KeepStatistics(ctx, s.cfg.EventsAnalyzeInterval, int64(s.cfg.EventsAnalyzeMinRows), s.log, s.outage)
}
