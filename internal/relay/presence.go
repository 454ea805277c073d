package relay

import (
	"context"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/presence"
)

// presenceStore boxes the server's presence store so it can be swapped
// atomically when the process joins Redis.
type presenceStore struct{ presence.Store }

// presenceEvents are the presence announcements a REQ's filters ask for
// (kind 20001 pinned with #h), sent before EOSE. readScope has already refused a
// REQ pinned to a channel the reader cannot read.
// stored counts the stored events the REQ returned, which share each
// filter's limit with presence.
func (c *conn) presenceEvents(ctx context.Context, filters nostr.Filters, stored *presence.StoredCount) []*nostr.Event {
	return presence.Select(ctx, c.srv.presence.Load().Store, c.tenant.ID(), filters, c.srv.now(), c.srv.cfg.MaxLimit, stored)
}
