package relay

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/trace"
)

// readScope authorizes a REQ/COUNT (docs/read-scope.md) and returns what its rows
// are limited to. A non-empty reason means the request is refused: a filter
// pinned (#h) to a channel the caller cannot read, or one asking for p-gated
// kinds without a #p or authors naming only the caller.
func (s *Server) readScope(ctx context.Context, tenant community.Tenant, reader string, filters nostr.Filters) (eventstore.Scope, string, error) {
	// A reader's first REQ reads its channels from the database, and any
	// client may AUTH with a fresh key before each REQ: that read waits for
	// a read slot; a cached answer does not.
	readable, err := s.access.ReadableInSlot(ctx, tenant.ID(), reader, s.readSlot)
	if err != nil {
		return eventstore.Scope{}, "", err
	}
	for i := range filters {
		f := &filters[i]
		for _, kind := range f.Kinds {
			if nostr.IsPGated(kind) && !onlySelf(f.Tags["p"], reader) && !onlySelf(f.Authors, reader) {
				return eventstore.Scope{}, fmt.Sprintf("restricted: kind %d is only readable with a #p or authors filter naming only you", kind), nil
			}
		}
		for _, h := range f.Tags["h"] {
			id, err := uuid.Parse(h)
			if err != nil || !readable.Has(id) {
				return eventstore.Scope{}, "restricted: not a channel member", nil
			}
		}
	}
	// Each later page of the history reads the readable set again: from
	// memory while nothing changed, so a member removed while their history
	// streams is sent nothing the channel stored after the removal.
	// The list is rebuilt only when the answer is another: at thousands of
	// readable channels, rebuilding it costs as much as the page it scopes.
	again := func(ctx context.Context) ([]uuid.UUID, bool, error) {
		if hook := s.beforeLaterPage.Load(); hook != nil {
			(*hook)()
		}
		now, err := s.access.ReadableInSlot(ctx, tenant.ID(), reader, s.readSlot)
		if err != nil || now.Same(readable) {
			return nil, false, err
		}
		readable = now
		return now.IDs(), true, nil
	}
	return eventstore.Scope{Channels: readable.IDs(), Reader: reader, Readable: again, Now: s.now()}, "", nil
}

// traceRead records what a REQ returned for the conformance checker: each
// row's true owning community, looked up without the tenant predicate.
func (c *conn) traceRead(ctx context.Context, st trace.AbstractState, filters nostr.Filters, rowChannels []*uuid.UUID) error {
	var pinned *uuid.UUID
	if len(filters) == 1 && len(filters[0].Tags["h"]) == 1 {
		if id, err := uuid.Parse(filters[0].Tags["h"][0]); err == nil {
			pinned = &id
			trace.RecordReqAuthCheck(c.srv.Tracer, st, id, true)
		}
	}
	seen := map[uuid.UUID]struct{}{}
	var ids []uuid.UUID
	for _, ch := range rowChannels {
		if ch != nil {
			if _, dup := seen[*ch]; !dup {
				seen[*ch] = struct{}{}
				ids = append(ids, *ch)
			}
		}
	}
	lookup := map[uuid.UUID]uuid.UUID{}
	if len(ids) > 0 {
		rows, err := c.srv.queries.ChannelCommunities(ctx, ids)
		if err != nil {
			return err
		}
		for _, row := range rows {
			lookup[row.ID] = row.CommunityID
		}
	}
	trace.RecordReadMessageRows(c.srv.Tracer, st, pinned, rowChannels, c.tenant.ID(), lookup)
	return nil
}

func onlySelf(values []string, self string) bool {
	if len(values) == 0 {
		return false
	}
	for _, v := range values {
		if v != self {
			return false
		}
	}
	return true
}
