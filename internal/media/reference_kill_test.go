package media_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
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
// TestKilledBetweenReferenceWritesLeavesADeletableBlob, deleteHelperEnv
// that of TestKilledBetweenDeleteRemovalsLeavesNoUndeletableBlob.
const (
	referenceHelperEnv = "BUZZ_TEST_REFERENCE_HELPER_DIR"
	deleteHelperEnv    = "BUZZ_TEST_DELETE_HELPER_DIR"
)

// A relay killed (kill -9) between an upload's two writes that reference
// a blob in its community, the sidecar and the upload record, never
// leaves a sidecar without an upload record: such a sidecar serves the
// blob and counts it against the quota, and no member can ever delete it
// (a delete needs one of the deleter's own records). A helper process
// (this test binary, run again) uploads into a store that stops at the
// second of the two writes; it is SIGKILLed there. What may be left is a
// record without a sidecar: the blob is not served, whoever uploads it
// again writes the sidecar and may delete it, and the uploader's delete
// removes the record (left, it would count against the quota for good).
// Mutations killed: the sidecar written before the upload record (the
// sidecar stays with no record); records without a sidecar not removed by
// a delete (it answers ErrNotFound and the record stays).
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

	svc := media.NewService(store, media.Limits{MaxBytes: 1 << 20, AllowedTypes: []string{"text/plain"}, TempDir: dir}, nil)
	sum := sha256.Sum256([]byte(killedUploadText))
	require.NoError(t, svc.Delete(context.Background(), killedUploadCommunity, hex.EncodeToString(sum[:]), "alice"), "the uploader's delete of what the killed upload left")
	for _, prefix := range media.CommunityPrefixes(killedUploadCommunity) {
		left, err := store.List(context.Background(), prefix)
		require.NoError(t, err)
		require.Empty(t, left, "what the killed upload left of the community's references")
	}
}

// killedUploadCommunity is the community the reference helper uploads to,
// killedUploadText the blob it uploads.
var killedUploadCommunity = uuid.MustParse("5e3c1f0a-2b7d-4c86-a1e9-7f40d2b6c813")

const killedUploadText = "some text"

// referenceHelper is the process the test kills: an upload stopped at its
// second write under the community's prefixes, in a store under dir.
func referenceHelper(dir string) {
	store, err := media.NewFSStore(filepath.Join(dir, "store"))
	if err == nil {
		svc := media.NewService(&stopAtSecondReference{Store: store}, media.Limits{MaxBytes: 1 << 20, AllowedTypes: []string{"text/plain"}, TempDir: dir}, nil)
		_, err = svc.Upload(context.Background(), killedUploadCommunity, "alice", strings.NewReader(killedUploadText), nil)
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

// killedDeleteCommunity is the community the delete helper uploads to and
// deletes from.
var killedDeleteCommunity = uuid.MustParse("0b6d2a4e-7f3c-4e1a-9c55-3d2f8a6b1c07")

// killedDeleteText is the blob the delete helper uploads and deletes.
const killedDeleteText = "text its uploader deletes"

// A relay killed (kill -9) between a delete's two removals, the member's
// upload record and the community's sidecar, never leaves the sidecar
// without a record: the blob would stay served and counted while every
// member's delete, the uploader's retry included, answered "not the
// uploader" for good. A helper process (this test binary, run again)
// uploads a blob and deletes it through a store that stops at the
// delete's second removal; it is SIGKILLed there. The uploader's retry
// then removes what is left: the blob is not served, and the community
// holds no record of it (a record left would count against the quota for
// good, and keep the sidecar of a later upload by another member).
// Mutations killed: the upload records removed before the sidecar (the
// retry answers ErrNotUploader and the blob is still served); records
// without a sidecar not removed by a delete (the retry answers
// ErrNotFound and the record stays).
func TestKilledBetweenDeleteRemovalsLeavesNoUndeletableBlob(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	helper := exec.Command(os.Args[0])
	helper.Env = append(os.Environ(), deleteHelperEnv+"="+dir)
	out, err := helper.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, helper.Start())
	removing := false
	for lines := bufio.NewScanner(out); lines.Scan(); {
		if lines.Text() == "removing" {
			removing = true
			break
		}
	}
	require.True(t, removing, "the helper never reached its delete's second removal")
	require.NoError(t, helper.Process.Signal(syscall.SIGKILL))
	_ = helper.Wait()

	store, err := media.NewFSStore(filepath.Join(dir, "store"))
	require.NoError(t, err)
	svc := media.NewService(store, media.Limits{MaxBytes: 1 << 20, AllowedTypes: []string{"text/plain"}, TempDir: dir}, nil)
	sum := sha256.Sum256([]byte(killedDeleteText))
	sha := hex.EncodeToString(sum[:])
	require.NoError(t, svc.Delete(context.Background(), killedDeleteCommunity, sha, "alice"), "the uploader's delete, sent again after the relay was killed")
	_, _, err = svc.Open(context.Background(), killedDeleteCommunity, sha)
	require.ErrorIs(t, err, media.ErrNotFound, "the blob its uploader deleted is still served")
	for _, prefix := range media.CommunityPrefixes(killedDeleteCommunity) {
		left, err := store.List(context.Background(), prefix)
		require.NoError(t, err)
		require.Empty(t, left, "what the killed delete left of the community's references")
	}
	require.ErrorIs(t, svc.Delete(context.Background(), killedDeleteCommunity, sha, "alice"), media.ErrNotFound, "nothing left to delete")
}

// deleteHelper is the process the test kills: a delete stopped at its
// second removal under the community's prefixes, in a store under dir.
func deleteHelper(dir string) {
	store, err := media.NewFSStore(filepath.Join(dir, "store"))
	if err == nil {
		stopping := &stopAtSecondRemoval{Store: store}
		svc := media.NewService(stopping, media.Limits{MaxBytes: 1 << 20, AllowedTypes: []string{"text/plain"}, TempDir: dir}, nil)
		var d media.Descriptor
		if d, err = svc.Upload(context.Background(), killedDeleteCommunity, "alice", strings.NewReader(killedDeleteText), nil); err == nil {
			err = svc.Delete(context.Background(), killedDeleteCommunity, d.SHA256, "alice")
		}
	}
	fmt.Fprintf(os.Stderr, "delete helper: the delete returned: %v\n", err)
	os.Exit(2)
}

// stopAtSecondRemoval says "removing" on stdout at the second Delete of a
// sidecar or upload record, and never returns from it.
type stopAtSecondRemoval struct {
	media.Store
	deletes int
}

func (s *stopAtSecondRemoval) Delete(ctx context.Context, key string) error {
	if strings.HasPrefix(key, "_meta/") || strings.HasPrefix(key, "_uploads/") {
		if s.deletes++; s.deletes == 2 {
			fmt.Println("removing")
			time.Sleep(time.Hour)
		}
	}
	return s.Store.Delete(ctx, key)
}
