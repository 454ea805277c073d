package media_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/media"
)

// spoolHelperEnv names the directory of the helper process of
// TestKilledUploadLeavesNoSpoolFile; set, TestMain runs spoolHelper
// instead of the tests.
const spoolHelperEnv = "BUZZ_TEST_SPOOL_HELPER_DIR"

// A relay killed mid-upload (kill -9, out of memory) leaves nothing in
// its spool directory. A helper process (this test binary, run again)
// spools an upload whose body never ends; once the upload is copying the
// body into its spool file, the helper is SIGKILLed.
// Mutation killed: the spool file removed only when Upload returns (the
// deferred remove alone) leaves buzz-upload-* behind for good.
func TestKilledUploadLeavesNoSpoolFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	spool := filepath.Join(dir, "spool")
	require.NoError(t, os.Mkdir(spool, 0o700))
	helper := exec.Command(os.Args[0])
	helper.Env = append(os.Environ(), spoolHelperEnv+"="+dir)
	out, err := helper.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, helper.Start())
	spooling := false
	for lines := bufio.NewScanner(out); lines.Scan(); {
		if lines.Text() == "spooling" {
			spooling = true
			break
		}
	}
	require.True(t, spooling, "the helper never reached its spool")
	require.NoError(t, helper.Process.Signal(syscall.SIGKILL))
	_ = helper.Wait()
	left, err := os.ReadDir(spool)
	require.NoError(t, err)
	require.Empty(t, left, "a killed upload's spool file stays on disk")
}

// spoolHelper is the process TestKilledUploadLeavesNoSpoolFile kills: an
// upload stuck in the middle of its body, under dir.
func spoolHelper(dir string) {
	store, err := media.NewFSStore(filepath.Join(dir, "store"))
	if err == nil {
		svc := media.NewService(store, media.Limits{MaxBytes: 1 << 30, AllowedTypes: []string{"text/plain"}, TempDir: filepath.Join(dir, "spool")}, nil)
		_, err = svc.Upload(context.Background(), uuid.New(), "alice", &stuckBody{}, nil)
	}
	fmt.Fprintf(os.Stderr, "spool helper: the upload returned: %v\n", err)
	os.Exit(2)
}

// stuckBody is text whose second read says "spooling" on stdout (the
// upload has read its head and made its spool file) and whose third never
// returns.
type stuckBody struct{ reads int }

func (b *stuckBody) Read(p []byte) (int, error) {
	b.reads++
	switch b.reads {
	case 2:
		fmt.Println("spooling")
	case 3:
		time.Sleep(time.Hour)
	}
	for i := range p {
		p[i] = 'a'
	}
	return len(p), nil
}
