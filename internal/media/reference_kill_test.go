package media_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/media"
)

// referenceHelperEnv names the directory of the helper process of
// TestKilledBetweenReferenceWritesLeavesADeletableBlob.
const referenceHelperEnv = "BUZZ_TEST_REFERENCE_HELPER_DIR"

// A relay killed (kill -9) between an upload's two writes that reference
// a blob in its community, the sidecar and the upload record, never
// leaves a sidecar without an upload record: such a sidecar serves the
// blob and counts it against the quota, and no member can ever delete it
// (a delete removes the deleter's own records first). A helper process
// (this test binary, run again) uploads into a store that stops at the
// second of the two writes; it is SIGKILLed there. What may be left is a
// record without a sidecar: the blob is not served, and whoever uploads
// it again writes the sidecar and may delete it.
// Mutation killed: the sidecar written before the upload record (the
// sidecar stays with no record).
func TestKilledBetweenReferenceWritesLeavesADeletableBlob(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	helper := exec.Command(os.Args[0])
	helper.Env = append(os.Environ(), referenceHelperEnv+"="+dir)
	out, err := helper.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, helper.Start())
	referencing := false
	for lines := bufio.NewScanner(out); lines.Scan(); {
		if lines.Text() == "referencing" {
			referencing = true
			break
		}
	}
	require.True(t, referencing, "the helper never reached its second reference write")
	require.NoError(t, helper.Process.Signal(syscall.SIGKILL))
	_ = helper.Wait()

	store, err := media.NewFSStore(filepath.Join(dir, "store"))
	require.NoError(t, err)
	var sidecars, records int
	require.NoError(t, store.Walk(context.Background(), "", "", func(key string, _ int64) error {
		switch {
		case strings.HasPrefix(key, "_meta/"):
			sidecars++
		case strings.HasPrefix(key, "_uploads/"):
			records++
		}
		return nil
	}))
	require.Equal(t, 1, sidecars+records, "the helper was killed between its two reference writes")
	require.Zero(t, sidecars, "a sidecar with no upload record: served, counted, and nobody may delete it")
}

// referenceHelper is the process the test kills: an upload stopped at its
// second write under the community's prefixes, in a store under dir.
func referenceHelper(dir string) {
	store, err := media.NewFSStore(filepath.Join(dir, "store"))
	if err == nil {
		svc := media.NewService(&stopAtSecondReference{Store: store}, media.Limits{MaxBytes: 1 << 20, AllowedTypes: []string{"text/plain"}, TempDir: dir}, nil)
		_, err = svc.Upload(context.Background(), uuid.New(), "alice", strings.NewReader("some text"), nil)
	}
	fmt.Fprintf(os.Stderr, "reference helper: the upload returned: %v\n", err)
	os.Exit(2)
}

// stopAtSecondReference says "referencing" on stdout at the second Put of
// a sidecar or upload record, and never returns from it.
type stopAtSecondReference struct {
	media.Store
	puts int
}

func (s *stopAtSecondReference) Put(ctx context.Context, key string, body io.Reader, size int64, contentType string) error {
	if strings.HasPrefix(key, "_meta/") || strings.HasPrefix(key, "_uploads/") {
		if s.puts++; s.puts == 2 {
			fmt.Println("referencing")
			time.Sleep(time.Hour)
		}
	}
	return s.Store.Put(ctx, key, body, size, contentType)
}
