package deletion_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/deletion"
	"github.com/buzzrelay/buzz/internal/media"
)

// beforeDelete runs hook once, just before the first DeleteKeys that
// removes a key starting with prefix: another process acting between the
// deletion's steps.
type beforeDelete struct {
	media.Store
	prefix string
	once   sync.Once
	hook   func()
}

func (s *beforeDelete) DeleteKeys(ctx context.Context, keys []string) (int, int, error) {
	for _, k := range keys {
		if strings.HasPrefix(k, s.prefix) {
			s.once.Do(s.hook)
			break
		}
	}
	return s.Store.DeleteKeys(ctx, keys)
}

// A member of another community deletes their copy of a blob the doomed
// community shares while the deletion runs, between its shared-blob check
// and the removal of its own sidecars (two communities deleted at once
// interleave the same way). Each side saw the other's sidecar
// and kept the blob; nobody deleted it afterwards, so the bytes outlived
// both references and the deletion's own verification refused to finish
// (a late object, retried until the request blocked). A deletion must drop
// its own references before it decides whether a shared blob is still
// needed, as a member's media delete does.
// Mutation killed: shared-blob chunks deleted before the binding chunks
// (the run ends short of retention_pending with the blob still stored).
func TestSharedBlobReleasedByTheOtherCommunityMidDeletionIsDeleted(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	doomedHost := "doomed-shared.test"
	doomed := f.community(doomedHost)
	other := f.community("other-shared.test")
	fs, err := media.NewFSStore(t.TempDir())
	require.NoError(t, err)
	svc := media.NewService(fs, media.Limits{MaxBytes: 1 << 20, AllowedTypes: []string{"text/plain"}}, nil)
	mine := upload(t, svc, doomed, "bytes both communities hold")
	theirs := upload(t, svc, other, "bytes both communities hold")
	require.Equal(t, mine.Blob, theirs.Blob)

	store := &beforeDelete{Store: fs, prefix: media.CommunityPrefixes(doomed)[0], hook: func() {
		// The other community's uploader deletes it: its sidecar goes, and
		// the blob stays because the doomed community's sidecar is still
		// there.
		require.NoError(t, svc.Delete(context.Background(), other, theirs.SHA256, strings.Repeat("ab", 32)))
	}}
	req := f.submitAndApprove(doomedHost, store)
	exec := deletion.NewExecutor(deletion.Options{Pool: f.pool, Store: store, ID: "exec-shared", Config: testConfig()})
	out, err := exec.Run(f.ctx, req.ID)
	require.NoError(t, err)
	require.Equal(t, deletion.StageRetentionPending, out.Stage, "%+v last error %v", out, deref(out.LastError))
	_, err = fs.Stat(f.ctx, mine.Blob)
	require.ErrorIs(t, err, media.ErrNotFound, "no community references the blob any more")
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
