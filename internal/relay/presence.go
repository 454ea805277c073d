package relay

import (
	"context"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/presence"
)

// presenceStore boxes the server's presence store so it can be swapped
// atomically when the process joins Redis.
type presenceStore struct{ presence.Store }

// sendPresence sends a REQ the presence announcements its filters ask for
// (kind 20001 pinned with #h), before EOSE. readScope has already refused a
// REQ pinned to a channel the reader cannot read.
func (c *conn) sendPresence(ctx context.Context, subID string, filters nostr.Filters) error {
	for _, ev := range presence.Select(ctx, c.srv.presence.Load().Store, c.tenant.ID(), filters, c.srv.now(), c.srv.cfg.MaxLimit) {
		if err := c.send(nostr.EncodeEvent(subID, ev)); err != nil {
			return err
		}
	}
	return nil
}
