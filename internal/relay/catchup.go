package relay

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// Catching up after a lost subscription to the other relay processes'
// live traffic (crossrelay.Handlers.CatchUp). Not settings: they bound a
// replay, which only repairs a gap.
const (
	// catchUpMargin: how long before the last proof of hearing the replay
	// starts, and after the new subscription it ends. An event's
	// received_at is when its write began, by the database's clock; it is
	// published once it commits, and may wait in the publishing process's
	// queue, so an event received a little before the proof may have been
	// published after it. After the subscription, the margin covers a
	// database clock running ahead of this process's. What this process
	// heard is not sent twice (fanout.Hub.RememberPublished), so the
	// margins cost only reads.
	catchUpMargin = 5 * time.Second
	// catchUpMost: the most events a replay hands on. A longer gap (an
	// outage of minutes on a busy relay) is not replayed: a burst of that
	// many stale "live" events would push slow clients off, and its rows
	// would all be held at once. Clients resubscribing since their last
	// event get it from their REQ.
	catchUpMost = 10_000
	// catchUpLongest: the longest gap replayed. Its events would be stale
	// as "live" ones, and reading them in order means reading and sorting
	// every row received meanwhile, on the writer, by every relay process
	// at once when Redis returns.
	catchUpLongest = 10 * time.Minute
	catchUpTimeout = 30 * time.Second
	// catchUpBatch: how many of the gap's events are read and held at
	// once (4 MiB of events of 256 KB). Read whole, a gap of catchUpMost
	// such events was 2.5 GB, in every relay process at once.
	catchUpBatch = 16
	// publishedWindow: how long the hub remembers what it published. It
	// must reach back from a subscription's failure to catchUpMargin
	// before the last proof of hearing: a stalled Redis is dropped 4 s
	// after that proof.
	publishedWindow = 15 * time.Second
	publishedMost   = 200_000
)

// catchUp replays to the local fan-out the stored events of the
// communities with live subscriptions here that the database received
// between since and until, each widened by the margin: their keys first
// (which also tells a gap too large to replay), then the events a batch
// at a time. The hub skips what it published already, and later skips the
// live copy of what it replayed.
func (s *Server) catchUp(ctx context.Context, since, until time.Time) (replayed int, err error) {
	communities := s.hub.Communities()
	if len(communities) == 0 {
		return 0, nil
	}
	if gap := until.Sub(since); gap > catchUpLongest {
		return 0, fmt.Errorf("the gap lasted %s, longer than %s: too long to replay live", gap.Round(time.Second), catchUpLongest)
	}
	since, until = since.Add(-catchUpMargin), until.Add(catchUpMargin)
	ctx, cancel := context.WithTimeout(ctx, catchUpTimeout)
	defer cancel()
	// Expiration judged by the relay's clock, as a REQ judges it
	// (eventstore.Scope.Now): what a REQ here no longer returns is not sent
	// as live either.
	now := s.now()
	keys, err := s.queries.EventKeysReceivedBetween(ctx, db.EventKeysReceivedBetweenParams{
		Since: since, Until: until, Communities: communities, Now: now, MaxRows: catchUpMost + 1,
	})
	if err != nil {
		return 0, fmt.Errorf("read the events received since %s: %w", since.Format(time.RFC3339Nano), err)
	}
	if len(keys) > catchUpMost {
		return 0, fmt.Errorf("more than %d events were received since %s: too many to replay live",
			catchUpMost, since.Format(time.RFC3339Nano))
	}
	for batch := range slices.Chunk(keys, catchUpBatch) {
		params := db.EventsByKeyParams{Now: now}
		for _, k := range batch {
			params.Communities = append(params.Communities, k.CommunityID)
			params.CreatedAts = append(params.CreatedAts, k.CreatedAt)
			params.Ids = append(params.Ids, k.ID)
		}
		rows, err := s.queries.EventsByKey(ctx, params)
		if err != nil {
			return replayed, fmt.Errorf("read the events received since %s: %w", since.Format(time.RFC3339Nano), err)
		}
		for _, r := range rows {
			ev, err := storedEvent(r)
			if err != nil {
				return replayed, err
			}
			// A deletion missed live is news to the read routing too, told
			// before any subscriber here is sent it (as ingest and the bus
			// do): one who reads the channel again at once must not be
			// routed to a standby that has not replayed it. One heard live
			// already is told again, which only moves its mark later.
			s.noteRemoval(r.CommunityID, ev, r.ChannelID)
			st, missed := s.hub.Replay(r.CommunityID, ev, r.ChannelID, r.ReceivedAt)
			if missed {
				replayed++
			}
			s.metrics.FanoutDelivered.Add(float64(st.Delivered))
			s.metrics.FanoutDropped.Add(float64(st.Dropped))
		}
	}
	return replayed, nil
}

// storedEvent is the event a stored row holds.
func storedEvent(r db.EventsByKeyRow) (*nostr.Event, error) {
	ev := &nostr.Event{
		ID: hex.EncodeToString(r.ID), PubKey: hex.EncodeToString(r.Pubkey), CreatedAt: r.CreatedAt.Unix(),
		Kind: int(r.Kind), Content: r.Content, Sig: hex.EncodeToString(r.Sig),
	}
	if err := json.Unmarshal(r.Tags, &ev.Tags); err != nil {
		return nil, fmt.Errorf("stored event %x: tags: %w", r.ID, err)
	}
	return ev, nil
}
