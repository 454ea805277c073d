package eventstore

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// Query is QueryJSON with each event decoded, for tests that look inside
// the events; the relay only passes them on.
func (s *Store) Query(ctx context.Context, community uuid.UUID, scope Scope, filters nostr.Filters, fn func(ev *nostr.Event, channel *uuid.UUID) error) error {
	return s.QueryJSON(ctx, community, scope, filters, func(event []byte, channel *uuid.UUID) error {
		ev, err := nostr.ParseEvent(event, nostr.Limits{})
		if err != nil {
			return fmt.Errorf("stored event: %w", err)
		}
		return fn(ev, channel)
	})
}
