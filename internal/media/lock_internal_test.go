package media

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// An upload waits only for requests on its own hash: while one hash's lock
// is held, another blob uploads, the held hash's upload waits, and the
// lock table empties once everyone is done.
// Mutations killed: one lock for all hashes (the other blob waits too);
// the held hash not locked by Upload; entries never removed.
func TestUploadLocksOnlyItsHash(t *testing.T) {
	t.Parallel()
	store, err := NewFSStore(t.TempDir())
	require.NoError(t, err)
	svc := NewService(store, Limits{MaxBytes: 1 << 20, AllowedTypes: []string{"text/plain"}, TempDir: t.TempDir()}, nil)
	ctx := context.Background()
	held := "held bytes"
	d, err := svc.Upload(ctx, uuid.New(), "warm-up", strings.NewReader(held), nil)
	require.NoError(t, err)
	heldSHA := d.SHA256

	release := svc.lock(heldSHA)
	heldDone := make(chan error, 1)
	go func() {
		_, err := svc.Upload(ctx, uuid.New(), "alice", strings.NewReader(held), nil)
		heldDone <- err
	}()
	otherDone := make(chan error, 1)
	go func() {
		_, err := svc.Upload(ctx, uuid.New(), "bob", strings.NewReader("other bytes"), nil)
		otherDone <- err
	}()
	select {
	case err := <-otherDone:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("an upload of another hash waited for the held lock")
	}
	select {
	case <-heldDone:
		t.Fatal("an upload of the held hash went ahead without its lock")
	default:
	}
	release()
	select {
	case err := <-heldDone:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the held hash's upload never resumed")
	}
	svc.locksMu.Lock()
	defer svc.locksMu.Unlock()
	require.Empty(t, svc.locks)
}
