package eventstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// Every read statement on the writer pool holds a read slot: with every slot
// taken, a REQ page, a search and a COUNT each wait (until their context
// ends, or StatementTimeout, then ErrReadSlotsBusy) instead of taking a
// connection, and run once one is free.
//
// Mutations killed: any of the three read paths not taking a slot (it runs
// while every slot is held); the wait not bounded by StatementTimeout (the
// caller's 30 s context ends it instead: DeadlineExceeded).
func TestWriterReadsWaitForASlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	community, err := db.New(pool).CommunityEnsure(ctx, "read-slots.example")
	require.NoError(t, err)
	store := eventstore.New(pool, 10)
	store.ReadSlots = eventstore.NewReadSlots(1)
	discard := func([]byte, *uuid.UUID) error { return nil }
	reads := map[string]func(context.Context) error{
		"page": func(ctx context.Context) error {
			return store.QueryJSON(ctx, community.ID, eventstore.Scope{}, nostr.Filters{{Kinds: []int{1}}}, discard)
		},
		"search": func(ctx context.Context) error {
			return store.QueryJSON(ctx, community.ID, eventstore.Scope{}, nostr.Filters{{Search: "slots"}}, discard)
		},
		"count": func(ctx context.Context) error {
			_, _, err := store.Count(ctx, community.ID, eventstore.Scope{}, nostr.Filters{{Kinds: []int{1}}})
			return err
		},
	}

	require.NoError(t, store.ReadSlots.All().Acquire(ctx, 1))
	for name, read := range reads {
		waiting, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		err := read(waiting)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "the %s read ran while every read slot was held", name)
	}
	// The wait is bounded like a statement, whatever the caller's context.
	store.StatementTimeout = 50 * time.Millisecond
	for name, read := range reads {
		safety, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := read(safety)
		cancel()
		require.ErrorIs(t, err, eventstore.ErrReadSlotsBusy, "the %s read", name)
	}
	store.ReadSlots.All().Release(1)
	// With a slot free each read runs, under no statement bound of 50 ms: a
	// loaded machine (the race detector, every package at once) took longer
	// to plan and run the first search.
	store.StatementTimeout = 0
	for name, read := range reads {
		require.NoError(t, read(ctx), name)
	}
}
