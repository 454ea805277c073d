package relay

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/community"
)

// closing is why a community's connections close: the WebSocket close
// reason they get (with 1008), and whether its later connections are
// refused too.
type closing struct {
	reason string
	// forGood: a deletion is never undone, so a connection that resolved
	// the community just before it closed is refused as well. An archive
	// can be undone; its host stops resolving, and the sweep closes a
	// connection that slipped in meanwhile.
	forGood bool
}

var (
	closingDeleted  = closing{reason: "community deleted", forGood: true}
	closingArchived = closing{reason: "community archived"}
)

// archivedPrefix marks an archive's announcement; a deletion's payload is
// the bare id.
const archivedPrefix = "archived:"

// Reconnection backoff of the announcement listener.
const (
	closuresMinBackoff = 100 * time.Millisecond
	closuresMaxBackoff = 5 * time.Second
)

// WatchCommunityClosures closes the live connections of every community
// the database announces closed (triggers on communities notify
// community.ClosedChannel when a deletion starts quiescing it or an
// operator archives it), for as long as ctx
// lasts. Every relay on the database listens, so every relay closes them,
// with or without Redis. After each
// (re)connection, and every BUZZ_CLOSED_COMMUNITY_SWEEP, it also asks the
// database which of the communities it holds connections for are closed:
// an announcement sent while the listener was reconnecting is lost, and a
// connection can slip in between a host lookup and the announcement.
func (s *Server) WatchCommunityClosures(ctx context.Context) {
	backoff := closuresMinBackoff
	for ctx.Err() == nil {
		listening, err := s.listenForClosures(ctx)
		if ctx.Err() != nil {
			return
		}
		if listening {
			backoff = closuresMinBackoff
		}
		s.log.Warn("community closing announcements interrupted; sweeping and listening again", "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, closuresMaxBackoff)
	}
}

// listenForClosures listens on one dedicated connection until it fails;
// listening reports whether it got as far as listening.
func (s *Server) listenForClosures(ctx context.Context) (listening bool, err error) {
	pooled, err := s.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	// A listening session must never go back to the pool.
	conn := pooled.Hijack()
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+community.ClosedChannel); err != nil {
		return false, err
	}
	for {
		// Listening first, then sweeping: a closing committed in between
		// is seen by one or the other.
		if err := s.sweepClosedCommunities(ctx); err != nil {
			return true, err
		}
		wait, cancel := context.WithTimeout(ctx, s.cfg.ClosedCommunitySweep)
		for {
			n, err := conn.WaitForNotification(wait)
			if err != nil {
				cancel()
				if ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
					return true, err
				}
				break // time to sweep
			}
			why, payload := closingDeleted, n.Payload
			if rest, archived := strings.CutPrefix(payload, archivedPrefix); archived {
				why, payload = closingArchived, rest
			}
			if id, err := uuid.Parse(payload); err == nil {
				s.closeCommunity(id, why)
			} else {
				s.log.Warn("undecodable community closing announcement", "payload", n.Payload)
			}
		}
	}
}

// sweepClosedCommunities closes the connections of every community this
// relay holds connections for that the database says is closed.
func (s *Server) sweepClosedCommunities(ctx context.Context) error {
	s.mu.Lock()
	seen := map[uuid.UUID]struct{}{}
	for c := range s.conns {
		seen[c.tenant.ID()] = struct{}{}
	}
	s.mu.Unlock()
	if len(seen) == 0 {
		return nil
	}
	ids := make([]uuid.UUID, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	closed, err := s.queries.CommunityClosedAmong(ctx, ids)
	if err != nil {
		return err
	}
	for _, row := range closed {
		why := closingArchived
		if row.Deleting {
			why = closingDeleted
		}
		s.closeCommunity(row.ID, why)
	}
	return nil
}

// communitiesClosedAmong says which of ids the database says are closed (being
// deleted or archived).
func (s *Server) communitiesClosedAmong(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]bool, error) {
	rows, err := s.queries.CommunityClosedAmong(ctx, ids)
	if err != nil {
		return nil, err
	}
	closed := make(map[uuid.UUID]bool, len(rows))
	for _, row := range rows {
		closed[row.ID] = true
	}
	return closed, nil
}

// closeCommunity closes every connection of the community with 1008 and
// the reason, and refuses its new ones when it closed for good; other
// communities' connections are untouched. Repeated announcements are
// harmless.
func (s *Server) closeCommunity(id uuid.UUID, why closing) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, already := s.closedCommunities[id]; !already {
		s.log.Info("community closed: closing its connections", "community", id, "reason", why.reason)
	}
	if why.forGood {
		s.closedCommunities[id] = struct{}{}
	}
	for c := range s.conns {
		if c.tenant.ID() == id && c.closedForCommunity.CompareAndSwap(false, true) {
			s.metrics.CommunityClosedConns.WithLabelValues(why.reason).Inc()
			go c.closeWS(websocket.StatusPolicyViolation, why.reason)
		}
	}
}
