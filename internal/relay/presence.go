package relay

import (
	"context"

	"github.com/google/uuid"

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
// (kind 20001 pinned with #h), sent before EOSE. readScope has already
// refused a REQ pinned to a channel the reader cannot read.
// stored counts the stored events the REQ returned, which share each
// filter's limit with presence. Each Redis read has its own deadline, so
// the connection's context serves: the REQ's query budget may be spent by
// a slow reader of its history before presence is read.
func (s *Server) presencePlan(ctx context.Context, community uuid.UUID, filters nostr.Filters, stored *presence.StoredCount) *presence.Plan {
	return presence.Choose(ctx, s.presence.Load().Store, community, filters, s.now(), s.cfg.MaxLimit, stored)
}

// presenceCount is how many announcements a REQ of filters would get from
// the present, which a COUNT adds to the stored events it counts: without
// it a COUNT of a channel's presence answered 0 while a REQ of the same
// filter returned the announcements. readScope has already refused a
// filter pinned to a channel the reader cannot read.
func (s *Server) presenceCount(ctx context.Context, community uuid.UUID, filters nostr.Filters) int64 {
	return presence.Count(ctx, s.presence.Load().Store, community, filters, s.now())
}
