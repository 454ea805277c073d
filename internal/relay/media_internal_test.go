package relay

import (
	"fmt"
	"net/http"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/media"
)

// A spool that ran out of disk is the relay's storage being full (507), a
// state a client may wait out; anything else is the relay's fault (500).
// Mutation killed: ENOSPC not told apart.
func TestSpoolFailureOnAFullDiskIsInsufficientStorage(t *testing.T) {
	status, msg := spoolFailure(fmt.Errorf("%w: write /tmp/buzz-upload-1: %w", media.ErrSpool, syscall.ENOSPC))
	require.Equal(t, http.StatusInsufficientStorage, status)
	require.Equal(t, "error: the relay's upload spool is out of disk space; try again later", msg)

	status, _ = spoolFailure(fmt.Errorf("%w: %w", media.ErrSpool, syscall.ENOENT))
	require.Equal(t, http.StatusInternalServerError, status)
}
