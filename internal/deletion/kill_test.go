package deletion_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/deletion"
	"github.com/buzzrelay/buzz/internal/media"
)

// Environment of the executor child process the crash test kills.
const (
	childDBEnv      = "BUZZ_TEST_DELETION_CHILD_DB"
	childStoreEnv   = "BUZZ_TEST_DELETION_CHILD_STORE"
	childRequestEnv = "BUZZ_TEST_DELETION_CHILD_REQUEST"
)

// TestKilledExecutorChild is the executor the crash test runs as a child
// process and kills; run directly (no child environment) it does nothing.
func TestKilledExecutorChild(t *testing.T) {
	if os.Getenv(childRequestEnv) == "" {
		return
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(childDBEnv))
	require.NoError(t, err)
	store, err := media.NewFSStore(os.Getenv(childStoreEnv))
	require.NoError(t, err)
	cfg, err := deletion.ConfigFromEnv(os.Getenv)
	require.NoError(t, err)
	id := uuid.MustParse(os.Getenv(childRequestEnv))
	_, err = deletion.NewExecutor(deletion.Options{Pool: pool, Store: store, ID: "doomed-child", Config: cfg}).Run(ctx, id)
	t.Fatalf("the child executor should have been killed at the pause, it returned %v", err)
}

// memoryDir is a fresh directory in memory when the machine has one
// (/dev/shm): ten thousand small files are written in a fraction of the
// time a loaded disk takes.
func memoryDir(t *testing.T) string {
	t.Helper()
	if dir, err := os.MkdirTemp("/dev/shm", "buzz-deletion-"); err == nil {
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return t.TempDir()
}

// writeUploadRecords writes n upload records of the community straight
// into the filesystem store, one per blob hash.
func writeUploadRecords(t *testing.T, dir string, community uuid.UUID, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		sum := sha256.Sum256([]byte{byte(i), byte(i >> 8), byte(i >> 16)})
		sha := hex.EncodeToString(sum[:])
		p := filepath.Join(dir, "_uploads", community.String(), sha)
		require.NoError(t, os.MkdirAll(p, 0o750))
		require.NoError(t, os.WriteFile(filepath.Join(p, "01J00000000000000000000000.json"), []byte(`{"pubkey":"x"}`), 0o600))
	}
}

// A 10,001-object community makes two manifest chunks (10,000 + 1). The
// executor, a real child process, is SIGKILLed after deleting the first
// chunk's objects and before stamping the chunk; a successor takes the
// request over under generation 2 once the lease expires, deletes the
// chunk again (every key already missing), and finishes with zero objects
// left. Kills: a stamp written before the objects are deleted (the
// successor would skip chunk 0 and leave 10,000 objects), a successor that
// treats an unstamped chunk as done, and a claim that does not wait for
// lease expiry.
func TestKilledExecutorResumesUnderTheNextGeneration(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := f.community("crash.test")
	dir := memoryDir(t)
	writeUploadRecords(t, dir, c, 10001)
	store, err := media.NewFSStore(dir)
	require.NoError(t, err)
	req := f.submitAndApprove("crash.test", store)

	pause := filepath.Join(t.TempDir(), "paused")
	child := exec.Command(os.Args[0], "-test.run=^TestKilledExecutorChild$", "-test.count=1")
	child.Env = append(os.Environ(),
		childDBEnv+"="+f.pool.Config().ConnString(), childStoreEnv+"="+dir, childRequestEnv+"="+req.ID.String(),
		"BUZZ_DELETION_LEASE_SECS=2", "BUZZ_DELETION_TEST_PAUSE_BEFORE_STAMP="+pause)
	var childOut strings.Builder
	child.Stdout, child.Stderr = &childOut, &childOut
	require.NoError(t, child.Start())
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	eventually(t, func() bool {
		_, err := os.Stat(pause)
		select {
		case err := <-exited:
			t.Fatalf("child exited early (%v): %s", err, childOut.String())
		default:
		}
		return err == nil
	}, "the child executor to reach the pause")

	// The first chunk's objects are gone, its stamp is not written.
	chunk0, err := f.q.DeletionManifestChunk(f.ctx, db.DeletionManifestChunkParams{RequestID: req.ID, ChunkNo: 0})
	require.NoError(t, err)
	require.Nil(t, chunk0.DeletedAt)
	var keys []string
	require.NoError(t, json.Unmarshal(chunk0.Keys, &keys))
	require.Len(t, keys, 10000)
	chunk1, err := f.q.DeletionManifestChunk(f.ctx, db.DeletionManifestChunkParams{RequestID: req.ID, ChunkNo: 1})
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(chunk1.Keys, &keys))
	require.Len(t, keys, 1)
	left, err := store.List(f.ctx, media.CommunityPrefixes(c)[1])
	require.NoError(t, err)
	require.Len(t, left, 1)

	require.NoError(t, child.Process.Signal(syscall.SIGKILL))
	<-exited

	eventually(t, func() bool {
		var expired bool
		return f.pool.QueryRow(f.ctx, `SELECT lease_until < now() FROM community_deletion_requests WHERE id = $1`, req.ID).Scan(&expired) == nil && expired
	}, "the killed executor's lease to expire")
	out, err := deletion.NewExecutor(deletion.Options{Pool: f.pool, Store: store, ID: "successor", Config: testConfig()}).Run(f.ctx, req.ID)
	require.NoError(t, err)
	require.Equal(t, deletion.StageRetentionPending, out.Stage, "%+v", out)

	left, err = store.List(f.ctx, "_uploads/"+c.String()+"/")
	require.NoError(t, err)
	require.Empty(t, left)
	cps, err := f.q.DeletionCheckpointsOfRequest(f.ctx, req.ID)
	require.NoError(t, err)
	var chunkDetails []string
	for _, cp := range cps {
		if strings.HasPrefix(cp.UnitKey, "chunk:") {
			require.EqualValues(t, 2, cp.LeaseGeneration, cp.UnitKey)
			chunkDetails = append(chunkDetails, cp.UnitKey+" "+string(cp.Detail))
		}
	}
	require.Len(t, chunkDetails, 2, "exactly two chunks")
	require.Contains(t, chunkDetails[0], `"already_missing": 10000`, "the successor re-deleted chunk 0: every key already gone")
}
