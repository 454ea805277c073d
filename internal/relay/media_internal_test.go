package relay

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

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

// readFromRecorder is a ResponseWriter with a ReadFrom of its own, as
// net/http's (which sends a file with sendfile); it counts its calls.
type readFromRecorder struct {
	*httptest.ResponseRecorder
	readFrom int
}

func (r *readFromRecorder) ReadFrom(src io.Reader) (int64, error) {
	r.readFrom++
	return io.Copy(r.ResponseRecorder, src)
}

// A blob served from a file reaches the connection's own ReadFrom through
// the media wrappers (the count and the refusals' JSON), so net/http sends
// it with sendfile; the bytes are counted all the same.
// Mutations killed: either wrapper without ReadFrom (ServeContent copies
// through Write: the connection's ReadFrom is never called).
func TestMediaDownloadKeepsTheWritersReadFrom(t *testing.T) {
	t.Parallel()
	blob := bytes.Repeat([]byte("sendfile "), 10000)
	path := filepath.Join(t.TempDir(), "blob")
	require.NoError(t, os.WriteFile(path, blob, 0o600))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()

	conn := &readFromRecorder{ResponseRecorder: httptest.NewRecorder()}
	counted := &countingWriter{ResponseWriter: conn, status: http.StatusOK}
	req := httptest.NewRequest(http.MethodGet, "/media/x", nil)
	http.ServeContent(&contentRefusals{ResponseWriter: counted}, req, "", time.Unix(0, 0), f)

	require.Equal(t, 1, conn.readFrom, "the blob went through the connection's ReadFrom")
	require.Equal(t, http.StatusOK, conn.Code)
	require.Equal(t, blob, conn.Body.Bytes())
	require.EqualValues(t, len(blob), counted.n, "the bytes sent are counted")
}
