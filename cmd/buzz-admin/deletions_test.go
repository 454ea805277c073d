package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/deletion"
)

// The operator's whole path through the CLI: submit, approve, run (JSON
// progress lines when stdout is not a terminal), a rerun of the finished
// request exits 5, list and inspect show the evidence, and there is no
// continuous worker command. Kills: a run that exits 0 on a request it
// could not claim.
func TestDeletionsCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.URL(t)
	mediaDir := t.TempDir()
	env := map[string]string{"BUZZ_DATABASE_URL": url, "BUZZ_MEDIA_DIR": mediaDir, "BUZZ_REDIS_URL": dbtest.RedisURL(t)}
	getenv := func(k string) string { return env[k] }
	cmd := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(ctx, args, getenv, &out)
		return out.String(), err
	}
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = db.New(pool).CommunityCreate(ctx, "cli-doomed.test")
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Join(mediaDir, "stray"), 0o750))
	require.NoError(t, os.WriteFile(filepath.Join(mediaDir, "stray", "file.txt"), []byte("?"), 0o600))

	_, err = cmd("deletions", "submit", "--host", "cli-doomed.test")
	require.ErrorContains(t, err, "--requested-by")
	out, err := cmd("deletions", "submit", "--host", "CLI-Doomed.test", "--requested-by", "ops", "--reason", "customer left")
	require.NoError(t, err)
	var req requestJSON
	require.NoError(t, json.Unmarshal([]byte(out), &req))
	require.Equal(t, deletion.StageInventoried, req.Stage)
	require.Len(t, req.InventoryDigest, 64)

	_, err = cmd("deletions", "run", req.ID.String())
	var exit exitError
	require.ErrorAs(t, err, &exit)
	require.Equal(t, exitNotRunnable, exit.code, "not approved yet")

	out, err = cmd("deletions", "approve", req.ID.String(), "--approved-by", "lead", "--note", "ticket 42")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal([]byte(out), &req))
	require.Equal(t, deletion.StageApproved, req.Stage)
	require.Equal(t, req.InventoryDigest, req.Approval.InventoryDigest)

	out, err = cmd("deletions", "run", req.ID.String(), "--executor-id", "cli-test")
	require.NoError(t, err, out)
	var progressLines int
	var last map[string]json.RawMessage
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		last = nil
		require.NoError(t, json.Unmarshal(sc.Bytes(), &last), "every line is JSON: %s", sc.Text())
		if _, ok := last["progress"]; ok {
			progressLines++
		}
	}
	require.Positive(t, progressLines)
	var outcomes []deletion.Outcome
	require.NoError(t, json.Unmarshal(last["outcomes"], &outcomes))
	require.Len(t, outcomes, 1)
	require.Equal(t, deletion.StageRetentionPending, outcomes[0].Stage)

	_, err = cmd("deletions", "run", req.ID.String())
	require.ErrorAs(t, err, &exit)
	require.Equal(t, exitNotRunnable, exit.code, "a finished request is not rerun")
	out, err = cmd("deletions", "drain")
	require.NoError(t, err, "nothing to drain is success")
	require.Contains(t, out, `"outcomes":[]`)

	out, err = cmd("deletions", "list", "--limit", "5")
	require.NoError(t, err)
	var list []requestJSON
	require.NoError(t, json.Unmarshal([]byte(out), &list))
	require.Len(t, list, 1)
	out, err = cmd("deletions", "inspect", req.ID.String())
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal([]byte(out), &req))
	require.NotEmpty(t, req.Checkpoints)
	require.Nil(t, req.LeaseOwner, "a finished request holds no lease")
	beats, err := db.New(pool).DeletionExecutorHeartbeats(ctx)
	require.NoError(t, err)
	require.Equal(t, "cli-test", beats[0].ExecutorID)
	require.NotNil(t, beats[0].StoppedAt)

	_, err = cmd("deletions", "worker")
	require.ErrorAs(t, err, &usageError{}, "no continuous worker")

	out, err = cmd("deletions", "sweep")
	require.ErrorAs(t, err, &exit)
	require.Equal(t, exitRunFailed, exit.code, "an unknown key makes the sweep exit 1")
	require.Contains(t, out, "stray/file.txt")
}

// A run that cannot reach its services blocks the request on record,
// without taking a lease; repeated attempts count up on one checkpoint,
// and unblock clears it. Kills: a run that fails without recording why.
func TestDeletionsRunWithoutServicesBlocksOnRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.URL(t)
	env := map[string]string{"BUZZ_DATABASE_URL": url, "BUZZ_REDIS_URL": "redis://127.0.0.1:1/0"}
	getenv := func(k string) string { return env[k] }
	cmd := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(ctx, args, getenv, &out)
		return out.String(), err
	}
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = db.New(pool).CommunityCreate(ctx, "cli-nosvc.test")
	require.NoError(t, err)
	// Without BUZZ_MEDIA_* a submit is refused unless the operator says
	// the deployment stores no media: the deletion would leave the media
	// behind and report itself complete. Kills: submit without that check.
	_, err = cmd("deletions", "submit", "--host", "cli-nosvc.test", "--requested-by", "ops")
	require.ErrorContains(t, err, "no media store is configured")
	require.ErrorContains(t, err, "--without-media")
	out, err := cmd("deletions", "submit", "--host", "cli-nosvc.test", "--requested-by", "ops", "--without-media")
	require.NoError(t, err)
	var req requestJSON
	require.NoError(t, json.Unmarshal([]byte(out), &req))
	require.Contains(t, string(req.Inventory), `"media_store": "none"`, "the approver sees the inventory listed no media")
	// A run started before the approval, from this shell, fails on its
	// settings but leaves the request waiting for its approver. Kills: a
	// pre-claim block of an unapproved request ("not waiting for approval").
	_, err = cmd("deletions", "run", req.ID.String())
	require.ErrorContains(t, err, "redis")
	_, err = cmd("deletions", "approve", req.ID.String(), "--approved-by", "lead")
	require.NoError(t, err)
	for i := 0; i < 2; i++ {
		_, err = cmd("deletions", "run", req.ID.String())
		var exit exitError
		require.ErrorAs(t, err, &exit)
		require.Equal(t, exitRunFailed, exit.code)
		require.ErrorContains(t, err, "redis")
	}
	out, err = cmd("deletions", "inspect", req.ID.String())
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal([]byte(out), &req))
	require.NotNil(t, req.BlockedReason)
	require.Contains(t, *req.BlockedReason, "redis")
	require.Nil(t, req.LeaseOwner)
	var setup *checkpointRow
	for i := range req.Checkpoints {
		if req.Checkpoints[i].UnitKey == "pre_claim:service_setup" {
			setup = &req.Checkpoints[i]
		}
	}
	require.NotNil(t, setup)
	require.EqualValues(t, 2, setup.Attempts)
	_, err = cmd("deletions", "unblock", req.ID.String(), "--unblocked-by", "oncall", "--reason", "redis is back")
	require.NoError(t, err)
}

// A run that cannot claim its request exits 5 and says what it found
// there and what to do: no such request; not approved yet (and by whom
// not); another executor's lease and until when (an operator deciding
// whether that executor is dead needs the time); a lease run out that a
// frozen step's transaction still holds (the claim passes the locked row
// over); blocked and why.
//
// Mutations killed (one at a time): the run answering with the claim's own
// error, which says the same "not runnable, is blocked, or is leased by
// another executor" in every one of these cases; a lease run out told as
// held "until" its past end, "run again after then" (the run after then
// says the same while the frozen step's transaction stands).
func TestARunThatCannotClaimSaysWhatItFound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.URL(t)
	env := map[string]string{"BUZZ_DATABASE_URL": url}
	cmd := func(args ...string) error {
		return run(ctx, args, func(k string) string { return env[k] }, &bytes.Buffer{})
	}
	notRunnable := func(args ...string) string {
		t.Helper()
		err := cmd(args...)
		var exit exitError
		require.ErrorAs(t, err, &exit, args)
		require.Equal(t, exitNotRunnable, exit.code, "%v: %v", args, err)
		return err.Error()
	}
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = db.New(pool).CommunityCreate(ctx, "cli-held.test")
	require.NoError(t, err)
	var out bytes.Buffer
	require.NoError(t, run(ctx, []string{"deletions", "submit", "--host", "cli-held.test", "--requested-by", "ops", "--without-media"},
		func(k string) string { return env[k] }, &out))
	var req requestJSON
	require.NoError(t, json.Unmarshal(out.Bytes(), &req))
	id := req.ID.String()

	require.Contains(t, notRunnable("deletions", "run", "00000000-0000-0000-0000-000000000000"), "no deletion request 00000000-0000-0000-0000-000000000000")
	require.Contains(t, notRunnable("deletions", "run", id), "not approved yet (stage inventoried)")
	require.NoError(t, cmd("deletions", "approve", id, "--approved-by", "lead"))

	// Another executor holds it, as one killed mid-run leaves it until its
	// lease ends.
	var until time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT lease_until FROM community_deletion_requests_claim($1, 'killed-executor', 3600)`, req.ID).Scan(&until))
	said := notRunnable("deletions", "run", id)
	require.Contains(t, said, `executor "killed-executor" holds its lease (generation 1) until `+until.UTC().Format(time.RFC3339))
	require.Contains(t, said, "run again after then")

	// An executor frozen inside a step past its lease: its lease check
	// holds the request row to the step's end, so the claim passes the row
	// over though the lease ran out. The step's transaction began before
	// the claim (its now() is then), so its check passes a lease of a
	// millisecond, which has run out by the run below.
	_, err = pool.Exec(ctx, `UPDATE community_deletion_requests SET lease_owner = NULL, lease_until = NULL WHERE id = $1`, req.ID)
	require.NoError(t, err)
	step, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = step.Rollback(context.Background()) }) // before pool.Close, which waits for it
	_, err = step.Exec(ctx, `SELECT 1`)
	require.NoError(t, err)
	var gen int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT lease_generation, lease_until FROM community_deletion_requests_claim($1, 'frozen-executor', 0.001)`, req.ID).Scan(&gen, &until))
	_, err = step.Exec(ctx, `SELECT community_deletion_requests_verify_lease($1, 'frozen-executor', $2, 'approved')`, req.ID, gen)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return time.Now().After(until) }, time.Minute, time.Millisecond)
	said = notRunnable("deletions", "run", id)
	require.Contains(t, said, fmt.Sprintf(`executor "frozen-executor"'s lease (generation %d) ran out at %s`, gen, until.UTC().Format(time.RFC3339)))
	require.Contains(t, said, "a transaction still holds the request")
	require.NotContains(t, said, "run again after then", "after then is past")
	require.NoError(t, step.Rollback(ctx))

	_, err = pool.Exec(ctx, `UPDATE community_deletion_requests SET lease_owner = NULL, lease_until = NULL WHERE id = $1`, req.ID)
	require.NoError(t, err)
	_, err = db.New(pool).DeletionRequestBlockPreclaim(ctx, db.DeletionRequestBlockPreclaimParams{ID: req.ID, Message: "media store unreachable"})
	require.NoError(t, err)
	said = notRunnable("deletions", "run", id)
	require.Contains(t, said, "blocked at stage approved since ")
	require.Contains(t, said, "media store unreachable; fix that, then `buzz-admin deletions unblock "+id+"`")
}

// A run's advice is a command that works. A request whose submit stopped
// before its inventory froze is told to repeat the submit (approve refuses
// it: it takes only a frozen inventory), and that repeat, as said, freezes
// it. A request blocked while it waits for its approval (a run from a
// shell without the media settings did that before runs left unapproved
// requests alone) is told to unblock (approve refuses a blocked request),
// and that unblock, as said, works.
//
// Mutations killed: stage submitted advised to approve (an approve that
// fails "not waiting for approval"); the approval advice checked before
// the block (an approve that fails "is blocked").
func TestARunsAdviceOnAnUnapprovedRequestIsACommandThatWorks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.URL(t)
	env := map[string]string{"BUZZ_DATABASE_URL": url}
	cmd := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(ctx, args, func(k string) string { return env[k] }, &out)
		return out.String(), err
	}
	// advised runs the request and returns the command between the first
	// pair of backquotes of what it says, split as a shell would.
	advised := func(id string) []string {
		t.Helper()
		_, err := cmd("deletions", "run", id)
		var exit exitError
		require.ErrorAs(t, err, &exit)
		require.Equal(t, exitNotRunnable, exit.code, "%v", err)
		_, rest, ok := strings.Cut(err.Error(), "`")
		require.True(t, ok, err.Error())
		command, _, ok := strings.Cut(rest, "`")
		require.True(t, ok, err.Error())
		var args []string
		for _, f := range strings.Fields(command) {
			args = append(args, strings.Trim(f, `"`))
		}
		require.Equal(t, "buzz-admin", args[0], err.Error())
		return args[1:]
	}
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	for _, host := range []string{"stopped-submit.test", "blocked-unapproved.test"} {
		_, err = db.New(pool).CommunityCreate(ctx, host)
		require.NoError(t, err)
	}

	// The submit's first step committed, then it stopped.
	var stopped string
	require.NoError(t, pool.QueryRow(ctx, `SELECT (community_deletion_requests_submit('stopped-submit.test', 'ops', NULL)).id::text`).Scan(&stopped))
	advice := advised(stopped)
	require.Equal(t, []string{"deletions", "submit", "--host", "stopped-submit.test", "--requested-by", "ops"}, advice)
	out, err := cmd(append(advice, "--without-media")...)
	require.NoError(t, err)
	var req requestJSON
	require.NoError(t, json.Unmarshal([]byte(out), &req))
	require.Equal(t, stopped, req.ID.String())
	require.Equal(t, deletion.StageInventoried, req.Stage)
	require.Equal(t, []string{"deletions", "approve", stopped, "--approved-by", "WHO"}, advised(stopped))

	// Blocked while it waited for its approval.
	_, err = cmd("deletions", "submit", "--host", "blocked-unapproved.test", "--requested-by", "ops", "--without-media")
	require.NoError(t, err)
	var blocked string
	require.NoError(t, pool.QueryRow(ctx, `SELECT (community_deletion_requests_block_preclaim(id, 'deletion services: no media store')).id::text
		FROM community_deletion_requests WHERE community_host = 'blocked-unapproved.test'`).Scan(&blocked))
	advice = advised(blocked)
	require.Equal(t, []string{"deletions", "unblock", blocked}, advice)
	_, err = cmd(append(advice, "--unblocked-by", "lead", "--reason", "media store set")...)
	require.NoError(t, err)
	_, err = cmd("deletions", "approve", blocked, "--approved-by", "lead")
	require.NoError(t, err)
}

// A command refused for the state of what it names says so in the
// operator's words, with the exit status its neighbours give the same
// state: archive and unarchive of a deleted community exit 1 as create of
// its host does, naming the host (the database's refusal named the
// community's id, "only its deletion executor may change its lifecycle");
// unblock of an unknown id exits 1 as approve of it does, "no deletion
// request ID" (it was the database's "deletion safety rule: ERROR: no
// deletion request ... (SQLSTATE BZ002)"), and of a request that is not
// blocked says there is nothing to unblock.
// Mutations killed: archive's refusal passed on as the database's; Unblock
// without its look at the request first (both unblocks say the
// database's text).
func TestRefusalsOfDeletedCommunitiesAndUnknownRequestsAreSaid(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := map[string]string{"BUZZ_DATABASE_URL": dbtest.URL(t)}
	cmd := func(args ...string) (status int, said string) {
		t.Helper()
		var out, stdout, stderr bytes.Buffer
		status = exitStatus(run(ctx, args, func(k string) string { return env[k] }, &out), &stdout, &stderr)
		if status == 0 {
			return 0, out.String()
		}
		var answer map[string]string
		require.NoError(t, json.Unmarshal(stderr.Bytes(), &answer), "%v: %s", args, stderr.String())
		return status, answer["error"]
	}
	status, _ := cmd("communities", "create", "gone.example")
	require.Zero(t, status)
	status, out := cmd("deletions", "submit", "--host", "gone.example", "--requested-by", "ops", "--without-media")
	require.Zero(t, status, out)
	var req requestJSON
	require.NoError(t, json.Unmarshal([]byte(out), &req))
	id := req.ID.String()
	status, out = cmd("deletions", "approve", id, "--approved-by", "lead")
	require.Zero(t, status, out)
	status, out = cmd("deletions", "run", id)
	require.Zero(t, status, out)

	taken, said := cmd("communities", "create", "gone.example")
	require.Contains(t, said, "already taken")
	for _, verb := range []string{"archive", "unarchive"} {
		status, said := cmd("communities", verb, "gone.example")
		require.Equal(t, taken, status, verb)
		require.Equal(t, `community "gone.example" is deleted or being deleted (deletion state tombstone): it can no longer be `+verb+`d, and its host stays reserved`, said)
	}

	unknown := "00000000-0000-0000-0000-000000000001"
	approveStatus, said := cmd("deletions", "approve", unknown, "--approved-by", "lead")
	require.Equal(t, "no deletion request "+unknown, said)
	status, said = cmd("deletions", "unblock", unknown, "--unblocked-by", "oncall", "--reason", "fixed")
	require.Equal(t, approveStatus, status)
	require.Equal(t, "no deletion request "+unknown, said)
	status, said = cmd("deletions", "unblock", id, "--unblocked-by", "oncall", "--reason", "fixed")
	require.Equal(t, approveStatus, status)
	require.Equal(t, "deletion safety rule: deletion request "+id+" is not blocked (stage retention_pending): there is nothing to unblock", said)
}

// Unblock decides under the row's lock, in the transaction that unblocks.
// An executor blocking the request at that very moment (its transaction
// holds the row, not yet committed) is waited for: the unblock then finds
// the block it was run for and clears it, where a look before the lock
// read the row as it was and said "not blocked". A blocked request an
// executor holds right now is refused in the operator's words, exit 1,
// naming the executor and its lease, not with the database's raw text.
// Mutations killed: Unblock reading the request before locking it, as it
// did (the unblock racing the block says "not blocked", exit 1); Unblock
// without its own lease check (the leased request gets "deletion safety
// rule: ERROR: deletion request ... is leased by ... (SQLSTATE BZ002)").
func TestUnblockDecidesUnderTheRowLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.URL(t)
	env := map[string]string{"BUZZ_DATABASE_URL": url}
	cmd := func(args ...string) (status int, said string) {
		var out, stdout, stderr bytes.Buffer
		status = exitStatus(run(ctx, args, func(k string) string { return env[k] }, &out), &stdout, &stderr)
		if status == 0 {
			return 0, out.String()
		}
		var answer map[string]string
		if err := json.Unmarshal(stderr.Bytes(), &answer); err != nil {
			return status, stderr.String()
		}
		return status, answer["error"]
	}
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = db.New(pool).CommunityCreate(ctx, "cli-unblock.test")
	require.NoError(t, err)
	status, out := cmd("deletions", "submit", "--host", "cli-unblock.test", "--requested-by", "ops", "--without-media")
	require.Zero(t, status, out)
	var req requestJSON
	require.NoError(t, json.Unmarshal([]byte(out), &req))
	id := req.ID.String()
	status, out = cmd("deletions", "approve", id, "--approved-by", "lead")
	require.Zero(t, status, out)

	// The executor's block, held open.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = db.New(tx).DeletionRequestBlockPreclaim(ctx, db.DeletionRequestBlockPreclaimParams{ID: req.ID, Message: "media store unreachable"})
	require.NoError(t, err)
	type answer struct {
		status int
		said   string
	}
	unblocked := make(chan answer, 1)
	go func() {
		status, said := cmd("deletions", "unblock", id, "--unblocked-by", "oncall", "--reason", "media store is back")
		unblocked <- answer{status, said}
	}()
	// Commit the block once the unblock waits for its row, or once the
	// unblock has answered without waiting.
	var early *answer
	require.Eventually(t, func() bool {
		select {
		case a := <-unblocked:
			early = &a
			return true
		default:
		}
		var waiting int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting))
		return waiting > 0
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, tx.Commit(ctx))
	var got answer
	if early != nil {
		got = *early
	} else {
		got = <-unblocked
	}
	require.Zero(t, got.status, "the unblock racing the block: %s", got.said)
	require.NoError(t, json.Unmarshal([]byte(got.said), &req))
	require.Nil(t, req.BlockedAt, "unblocked")

	// Blocked, and an executor holds it right now.
	_, err = pool.Exec(ctx, `UPDATE community_deletion_requests
		SET blocked_at = now(), blocked_reason = 'media store unreachable', lease_owner = 'busy-executor',
		    lease_until = now() + interval '1 hour', lease_generation = 7
		WHERE id = $1`, req.ID)
	require.NoError(t, err)
	var until time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT lease_until FROM community_deletion_requests WHERE id = $1`, req.ID).Scan(&until))
	status, said := cmd("deletions", "unblock", id, "--unblocked-by", "oncall", "--reason", "fixed")
	require.Equal(t, 1, status, said)
	require.Equal(t, "deletion safety rule: deletion request "+id+` is held by executor "busy-executor" (lease generation 7) until `+
		until.UTC().Format(time.RFC3339)+": it is working on the request right now; unblock it once that run ends or its lease runs out", said)

	// Its lease over, the same unblock goes through.
	_, err = pool.Exec(ctx, `UPDATE community_deletion_requests SET lease_until = now() - interval '1 second' WHERE id = $1`, req.ID)
	require.NoError(t, err)
	status, said = cmd("deletions", "unblock", id, "--unblocked-by", "oncall", "--reason", "fixed")
	require.Zero(t, status, said)
}
