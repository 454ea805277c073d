package ingest

import (
	"context"

	"github.com/google/uuid"
)

// BindChannelForWrite binds w to channel id when its actor may write there,
// by the rules every event with an h tag passes: the channel exists, is not
// archived, and a private one has the actor as an active member. A refusal
// is a *Rejection. It is for handlers that find the channel through
// something else the event names (a workflow, an approval).
func BindChannelForWrite(ctx context.Context, w *Write, id uuid.UUID) error {
	return bindChannelForWrite(ctx, w, id)
}
