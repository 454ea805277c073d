package media_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/media"
)

// A process killed in the middle of a Put leaves its partial file in the
// store's .tmp directory; the next store to start on that directory
// removes the ones older than an hour, and leaves a recent one (another
// process's write in progress) alone.
// Mutations killed: no sweep at start (the old file stays); sweeping
// whatever its age (the recent one goes).
func TestStartingStoreRemovesAbandonedWrites(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	tmp := filepath.Join(root, ".tmp")
	require.NoError(t, os.MkdirAll(tmp, 0o750))
	abandoned, inProgress := filepath.Join(tmp, "put-abandoned"), filepath.Join(tmp, "put-in-progress")
	for _, p := range []string{abandoned, inProgress} {
		require.NoError(t, os.WriteFile(p, []byte("partial blob"), 0o640))
	}
	old := time.Now().Add(-2 * time.Hour)
	require.NoError(t, os.Chtimes(abandoned, old, old))

	_, err := media.NewFSStore(root)
	require.NoError(t, err)
	require.NoFileExists(t, abandoned)
	require.FileExists(t, inProgress)
}
