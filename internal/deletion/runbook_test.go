package deletion_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/deletion"
	"github.com/buzzrelay/buzz/internal/media"
)

// The runbook runs against a database with a blocked request, a leased
// one mid-deletion and manifest chunks, and shows each. Kills: a runbook
// query broken by a schema change.
func TestRunbookShowsStagesLeasesBlocksAndChunks(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.community("blocked.test")
	blocked := f.submitAndApprove("blocked.test", nil)
	row := f.claim(blocked.ID, "ops-laptop:42", time.Hour)
	_, err := f.q.DeletionRequestRecordFailure(f.ctx, db.DeletionRequestRecordFailureParams{ID: blocked.ID, Owner: "ops-laptop:42",
		Generation: row.LeaseGeneration, Stage: deletion.StageApproved, Message: "bucket permission denied", Permanent: true, MaxStreak: 8})
	require.NoError(t, err)

	// An executor paused mid-deletion: two chunks (2 + 1 keys), the first
	// chunk's objects deleted, its stamp not yet written.
	c := f.community("midway.test")
	dir := memoryDir(t)
	writeUploadRecords(t, dir, c, 3)
	store, err := media.NewFSStore(dir)
	require.NoError(t, err)
	midway := f.submitAndApprove("midway.test", store)
	cfg := testConfig()
	cfg.ManifestChunkKeys = 2
	cfg.PauseBeforeStampFile = filepath.Join(t.TempDir(), "paused")
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() {
		_, err := deletion.NewExecutor(deletion.Options{Pool: f.pool, Store: store, ID: "runbook-exec", Config: cfg}).Run(ctx, midway.ID)
		done <- err
	}()
	defer func() {
		cancel()
		<-done
	}()
	eventually(t, func() bool { _, err := os.Stat(cfg.PauseBeforeStampFile); return err == nil }, "the executor to pause")

	cmd := exec.Command(dbtest.PsqlPath(t), "-X", "-v", "ON_ERROR_STOP=1", "-f", "../../sql/runbooks/deletion.sql", psqlURL(t, f))
	cmd.Env = append(os.Environ(), "PGTZ=UTC")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	text := string(out)
	require.Regexp(t, regexp.MustCompile(`approved\s*\|\s*1\s*\|\s*1\s*\|\s*0`), text, "requests by stage")
	require.Regexp(t, regexp.MustCompile(`drained\s*\|\s*1\s*\|\s*0\s*\|\s*1`), text)
	require.Regexp(t, regexp.MustCompile(`midway.test\s*\|\s*drained\s*\|\s*runbook-exec\s*\|\s*1\s*\|`), text, "lease holder")
	require.Regexp(t, regexp.MustCompile(`midway.test\s*\|\s*2\s*\|\s*0\s*\|\s*3\s*\|`), text, "chunk progress")
	require.Contains(t, text, "bucket permission denied", "blocked and why")
	require.Regexp(t, regexp.MustCompile(`midway.test\s*\|\s*fenced\s*\|\s*1\s*\|`), text, "the community is fenced")

	// While the manifest is frozen and execution runs, its chunks only take
	// the one-way deleted stamp: no new chunk, no rewrite, no removal, and
	// the frozen summary never changes.
	for _, stmt := range []string{
		`INSERT INTO community_deletion_manifest_keys (request_id, chunk_no, prefix, key_class, keys) VALUES ($1, 9, '_meta/x/', 'binding', '["k"]')`,
		`UPDATE community_deletion_manifest_keys SET keys = '["other"]' WHERE request_id = $1 AND chunk_no = 0`,
		`DELETE FROM community_deletion_manifest_keys WHERE request_id = $1`,
		`UPDATE community_deletion_requests SET destructive_manifest = '{}' WHERE id = $1`,
	} {
		_, err := f.pool.Exec(f.ctx, stmt, midway.ID)
		require.Equal(t, "23000", sqlState(err), "%s: %v", stmt, err)
	}
	_, err = f.pool.Exec(f.ctx, `UPDATE community_deletion_manifest_keys SET deleted_at = now() WHERE request_id = $1 AND chunk_no = 1`, midway.ID)
	require.NoError(t, err, "the stamp")
	_, err = f.pool.Exec(f.ctx, `UPDATE community_deletion_manifest_keys SET deleted_at = NULL WHERE request_id = $1 AND chunk_no = 1`, midway.ID)
	require.Equal(t, "23000", sqlState(err), "the stamp is one-way")

	// A shutdown mid-stage hands the request back: no lease, no failure
	// counted.
	cancel()
	require.NoError(t, <-done)
	done <- nil
	after, err := f.q.DeletionRequestGet(f.ctx, midway.ID)
	require.NoError(t, err)
	require.Nil(t, after.LeaseOwner)
	require.Zero(t, after.RetryCount)
	require.Nil(t, after.LastError)
}

// A runbook started while a migration holds a table it reads stops at
// once with a lock timeout, naming the wait, instead of waiting out the
// statement timeout in every section.
// Mutation killed: dropping `SET lock_timeout` from the runbook (the
// statement waits 30 s and fails with "statement timeout" instead).
func TestRunbookGivesUpOnALockedTable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	conn := f.plainConn()
	tx, err := conn.Begin(f.ctx)
	require.NoError(t, err)
	defer tx.Rollback(f.ctx)
	_, err = tx.Exec(f.ctx, "LOCK TABLE community_deletion_requests IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	cmd := exec.Command(dbtest.PsqlPath(t), "-X", "-v", "ON_ERROR_STOP=1", "-f", "../../sql/runbooks/deletion.sql", psqlURL(t, f))
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "canceling statement due to lock timeout")
}

// The runbook's chunk section shows where a large deletion stands: the
// next chunks to delete, not the first ones of the manifest, which are long
// gone. Kills: listing every request's chunks from chunk 0 under one
// overall limit (a manifest of more chunks than the limit showed only
// deleted ones, and hid every other request's).
func TestRunbookShowsTheNextChunksOfALargeDeletion(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := f.community("large.test")
	dir := memoryDir(t)
	writeUploadRecords(t, dir, c, 205)
	store, err := media.NewFSStore(dir)
	require.NoError(t, err)
	large := f.submitAndApprove("large.test", store)
	cfg := testConfig()
	cfg.ManifestChunkKeys = 1
	cfg.PauseBeforeStampFile = filepath.Join(t.TempDir(), "paused")
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() {
		_, err := deletion.NewExecutor(deletion.Options{Pool: f.pool, Store: store, ID: "runbook-exec", Config: cfg}).Run(ctx, large.ID)
		done <- err
	}()
	defer func() {
		cancel()
		<-done
	}()
	eventually(t, func() bool { _, err := os.Stat(cfg.PauseBeforeStampFile); return err == nil }, "the executor to pause")
	// The first 200 chunks deleted, as a long run leaves them.
	var chunks int
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM community_deletion_manifest_keys WHERE request_id = $1`, large.ID).Scan(&chunks))
	require.Greater(t, chunks, 200)
	_, err = f.pool.Exec(f.ctx, `UPDATE community_deletion_manifest_keys SET deleted_at = now() WHERE request_id = $1 AND chunk_no < 200`, large.ID)
	require.NoError(t, err)

	cmd := exec.Command(dbtest.PsqlPath(t), "-X", "-v", "ON_ERROR_STOP=1", "-f", "../../sql/runbooks/deletion.sql", psqlURL(t, f))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	_, section, _ := strings.Cut(string(out), "== 7.")
	section, _, _ = strings.Cut(section, "== 8.")
	require.Regexp(t, regexp.MustCompile(`(?m)^ `+large.ID.String()+`\s*\|\s*200\s*\|`), section, "the next chunk to delete")
	require.Regexp(t, regexp.MustCompile(`(?m)^ `+large.ID.String()+`\s*\|\s*199\s*\|`), section, "the last one deleted")
}
