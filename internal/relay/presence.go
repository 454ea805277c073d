package relay

import (
	"context"
	"maps"
	"slices"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/access"
	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/presence"
)

// presenceStore boxes the server's presence store so it can be swapped
// atomically when the process joins Redis.
type presenceStore struct{ presence.Store }

// presenceBatch is how many announcements a REQ reads at once: at most a
// history page's bytes (eventstore.DefaultPageBytes), which is what a REQ
// holds besides its reply budget while its client reads slowly.
const presenceBatch = eventstore.DefaultPageBytes / presence.MaxAnnouncementBytes

// presencePlan is the presence announcements a REQ's filters ask for
// (kind 20001 pinned with #h), sent before EOSE. readScope refused a REQ
// pinned to a channel the reader could not read when it arrived; the
// history sent before presence may have streamed for a while since (a
// slow client, a long history), so the pins are checked again here, and a
// member removed meanwhile is sent none of the channel's presence, as none
// of its later pages.
// stored counts the stored events the REQ returned, which share each
// filter's limit with presence. Each Redis read has its own deadline, so
// the connection's context serves: the REQ's query budget may be spent by
// a slow reader of its history before presence is read.
func (s *Server) presencePlan(ctx context.Context, tenant community.Tenant, reader string, filters nostr.Filters, stored *presence.StoredCount) (*presence.Plan, error) {
	if slices.ContainsFunc(filters, func(f nostr.Filter) bool { return len(f.Tags["h"]) > 0 && slices.Contains(f.Kinds, presence.Kind) }) {
		lookup, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
		readable, err := s.access.ReadableInSlot(lookup, tenant.ID(), reader, s.readSlot)
		cancel()
		if err != nil {
			return nil, err
		}
		filters = withReadablePins(filters, readable)
	}
	return presence.Choose(ctx, s.presence.Load().Store, tenant.ID(), filters, s.now(), s.cfg.MaxLimit, stored), nil
}

// withReadablePins is filters whose #h name only channels in readable. The
// filters given are left as they are: a live subscription holds them.
func withReadablePins(filters nostr.Filters, readable access.Channels) nostr.Filters {
	out := slices.Clone(filters)
	for i := range out {
		pins := out[i].Tags["h"]
		kept := slices.DeleteFunc(slices.Clone(pins), func(h string) bool {
			id, err := uuid.Parse(h)
			return err != nil || !readable.Has(id)
		})
		if len(kept) < len(pins) {
			out[i].Tags = maps.Clone(out[i].Tags)
			out[i].Tags["h"] = kept
		}
	}
	return out
}

// presenceCount is how many announcements a REQ of filters would get from
// the present, which a COUNT adds to the stored events it counts: without
// it a COUNT of a channel's presence answered 0 while a REQ of the same
// filter returned the announcements. readScope has already refused a
// filter pinned to a channel the reader cannot read.
func (s *Server) presenceCount(ctx context.Context, community uuid.UUID, filters nostr.Filters) int64 {
	return presence.Count(ctx, s.presence.Load().Store, community, filters, s.now())
}
