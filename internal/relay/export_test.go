package relay

import (
	"context"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sync/semaphore"

	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// ReadyChecks reports how many readiness checks ran and how many /ready
// requests were answered by a check another request started.
func (s *Server) ReadyChecks() (checks, joined int64) {
	return s.ready.checks.Load(), s.ready.joined.Load()
}

// HostLookupRunning reports whether a lookup of host is running.
func (s *Server) HostLookupRunning(host string) bool {
	s.hosts.mu.Lock()
	defer s.hosts.mu.Unlock()
	_, running := s.hosts.hosts[host]
	return running
}

// HostLookupsJoined reports how many requests waited for a host lookup
// that other requests shared.
func (s *Server) HostLookupsJoined() int64 { return s.hosts.joined.Load() }

// UploadsReceiving reports how many media uploads the relay is receiving
// (each holds its place from admission to its answer).
func (s *Server) UploadsReceiving() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.uploading.total
}

// SetReadyTimeout bounds each readiness check (default 2 s).
func (s *Server) SetReadyTimeout(d time.Duration) { s.ready.timeout = d }

// CrossRelayHears reports whether the relay's Redis bus proves it hears
// the other relays (false without a bus).
func (s *Server) CrossRelayHears() bool {
	bus := s.crossRelay.Load()
	return bus != nil && bus.Hears()
}

// KillCrossRelay makes the relay's Redis bus publish nothing more, not
// even a goodbye, as if the process were killed between commit and
// publish.
func (s *Server) KillCrossRelay() { s.crossRelay.Load().Kill() }

// FailNextCrossRelayPublish makes the relay's next publish of events to
// Redis fail, as a Redis error would, while the relay goes on announcing
// itself.
func (s *Server) FailNextCrossRelayPublish() { s.crossRelay.Load().FailNextPublish() }

// CatchUp runs the replay of a gap in the cross-relay traffic from since to
// until, as the Redis bus does on resubscribing.
func (s *Server) CatchUp(ctx context.Context, since, until time.Time) (int, error) {
	return s.catchUp(ctx, since, until)
}

// SubscribeInProcess registers sub with the relay's hub directly: its
// Receiver is handed each delivery on the delivering goroutine, so a test
// can see what else had happened by then.
func (s *Server) SubscribeInProcess(community uuid.UUID, sub *fanout.Subscription) {
	s.hub.Subscribe(community, sub)
}

// LastRemoval is when the read routing last learned of a removal in
// channel (docs/replica.md); zero when never, or without a reader.
func (s *Server) LastRemoval(community uuid.UUID, channel *uuid.UUID) time.Time {
	return s.store.Router.LastRemoval(community, channel)
}

// SetBeforeHistory runs f whenever a live REQ is registered with the hub
// and its stored events are not yet read.
func (s *Server) SetBeforeHistory(f func()) { s.beforeHistory.Store(&f) }

// SetBeforeLaterPage runs f before a read streamed in pages reads the
// reader's channels again for its next page.
func (s *Server) SetBeforeLaterPage(f func()) { s.beforeLaterPage.Store(&f) }

// RememberPresence keeps ev as its author's presence in channel, as the
// relay does for an accepted announcement, without a publisher per key.
func (s *Server) RememberPresence(community, channel uuid.UUID, ev *nostr.Event) error {
	return s.presence.Load().Remember(community, channel, ev, s.now())
}

// DeliverFromBus delivers ev as the cross-relay bus does an event another
// relay process wrote.
func (s *Server) DeliverFromBus(community uuid.UUID, ev *nostr.Event, channel *uuid.UUID) {
	s.deliverFromBus(community, ev, channel, 0)
}

// ReadSlots is the semaphore every read slot is taken from, so a test can
// hold them all as statements stuck in the database would.
func (s *Server) ReadSlots() *semaphore.Weighted { return s.store.ReadSlots.All() }

// BridgeRequestsAnswering reports how many HTTP bridge requests hold a
// place (from admission to their answer).
func (s *Server) BridgeRequestsAnswering() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bridging.total
}

// WebhookCallsAnswering reports how many workflow webhook calls hold a
// place (from admission to their answer).
func (s *Server) WebhookCallsAnswering() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.webhookCalls.total
}

// HoldReadShare takes every slot of addr's share of the read slots, as
// its reads stuck in the database would; release gives them back.
func (s *Server) HoldReadShare(addr string) (release func()) {
	ctx := eventstore.WithClient(context.Background(), addressBucket(addr))
	var releases []func()
	for range s.store.ReadSlots.Share() {
		r, err := s.store.ReadSlots.Acquire(ctx)
		if err != nil {
			panic(err)
		}
		releases = append(releases, r)
	}
	return func() {
		for _, r := range releases {
			r()
		}
	}
}

// MessageBurstSeconds is how many seconds of BUZZ_MESSAGES_PER_SECOND a
// connection may send at once.
const MessageBurstSeconds = messageBurstSeconds

// ReplayPurgeBatch is how many expired NIP-98 claims one purge deletes.
const ReplayPurgeBatch = replayPurgeBatch

// OutageFailures is how many client requests and background ticks the
// database outage in progress has counted failed (0 and 0 with the
// database reachable).
func (s *Server) OutageFailures() (requests, ticks int) { return s.outage.Failures() }

// HandshakeAddresses reports how many client addresses have a handshake
// bucket kept.
func (s *Server) HandshakeAddresses() int { return s.handshakes.Len() }
