package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A state file is the memory of one process: a second buzz-acp on it is
// refused at start, and the lock goes with the process that held it.
//
// Mutation killed: no lock: the second open succeeds.
func TestStateFileHasOneProcess(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "state.jsonl")
	j, err := openJournal(path)
	require.NoError(t, err)
	_, err = openJournal(path)
	require.ErrorContains(t, err, "in use by another buzz-acp")
	j.close()
	j, err = openJournal(path)
	require.NoError(t, err)
	j.close()
}

// A last line cut short (power lost mid-write) recorded nothing that
// counted as done, and is ignored; a damaged line before the last is an
// error, not a silent loss of what it recorded.
//
// Mutation killed: failing on the torn last line: the state file cannot be
// opened after a crash.
func TestStateFileTornLastLine(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "state.jsonl")
	id := strings.Repeat("ab", 32)
	require.NoError(t, os.WriteFile(path, []byte(`{"since":100}`+"\n"+`{"event":"`+id+`","created_at":100,"done":true}`+"\n"+`{"event":"cd`), 0o600))
	j, err := openJournal(path)
	require.NoError(t, err)
	require.EqualValues(t, 100, j.resumeFrom())
	require.True(t, j.handledBefore(id))
	j.close()

	bad := filepath.Join(dir, "bad.jsonl")
	require.NoError(t, os.WriteFile(bad, []byte(`{"since":1`+"\n"+`{"since":100}`+"\n"), 0o600))
	_, err = openJournal(bad)
	require.ErrorContains(t, err, "line 1")
}

// An append cut short (a full disk) leaves part of a line at the end of the
// file; the next record is written over it, so the file still opens and
// keeps that record. The part is written here behind the journal's back, as
// the failed write would have left it.
//
// Mutation killed: appending at the file's end (O_APPEND) instead of at the
// end of its last whole line: the next record joins the torn part on one
// line, and the file is refused at the next start.
func TestStateFileRecordAfterATornAppend(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "state.jsonl")
	j, err := openJournal(path)
	require.NoError(t, err)
	require.NoError(t, j.startAt(100))
	torn, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = torn.WriteString(`{"event":"` + strings.Repeat("cd", 40))
	require.NoError(t, err)
	require.NoError(t, torn.Close())
	id := strings.Repeat("ab", 32)
	require.NoError(t, j.done(id, 100, ""))
	j.close()

	j, err = openJournal(path)
	require.NoError(t, err, "the file opens after a torn append")
	require.True(t, j.handledBefore(id), "the record written after the torn append is kept")
	j.close()
}

// A catch-up reaches back at most its window, whatever the point written
// down; it never starts ahead of now.
//
// Mutation killed: the window not applied (start = the point written down):
// a restart after a week replays the week.
func TestCatchUpSpanIsBoundedByTheWindow(t *testing.T) {
	t.Parallel()
	now := int64(1_900_000_000)
	week := catchUpSpanOf(now-7*24*3600, now, 24*time.Hour)
	require.Equal(t, now-7*24*3600, week.from, "what was wanted, for the count")
	require.Equal(t, now-24*3600, week.start, "where the replay starts")
	require.Equal(t, now-1, week.until)

	recent := catchUpSpanOf(now-60, now, 24*time.Hour)
	require.Equal(t, now-60, recent.start)

	ahead := catchUpSpanOf(now+600, now, 24*time.Hour)
	require.Equal(t, now, ahead.start, "never ahead of now")
}

// A forgotten id (a doorbell dropped only because the relay could not be
// asked) that is handled again is remembered like any other: its stale place
// in the order does not make it fall out early.
//
// Mutation killed: forget leaving the id's place in the order (as before):
// with room for two, a, b after forgetting and re-adding a forgets a.
func TestSeenSetForgetThenAdd(t *testing.T) {
	t.Parallel()
	s := newSeenSet(2)
	require.True(t, s.add("a"))
	s.forget("a")
	require.True(t, s.add("a"), "forgotten, so new again")
	require.True(t, s.add("b"))
	require.False(t, s.add("a"), "a is one of the last two handled")
}
