package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/replica"
)

// acpProcess is buzz-acp run as its own process, so a test can kill it
// with SIGKILL the way a crash or an OOM kill would.
type acpProcess struct {
	t      *testing.T
	cmd    *exec.Cmd
	exited chan struct{}
	mu     sync.Mutex
	stderr []string
	health string // the /health URL once it is serving
}

// launch runs buzz-acp for the world's agent with the state file, the stub
// as its agent, and waits until it is connected; extraEnv are more settings
// (NAME=value).
func (w *world) launch(stateFile string, extraEnv ...string) *acpProcess {
	w.t.Helper()
	p := w.spawn(stateFile, extraEnv...)
	p.waitConnected()
	return p
}

// spawn is launch without waiting for the connection (a test that withholds
// the relay's frames may keep it from ever reporting one).
func (w *world) spawn(stateFile string, extraEnv ...string) *acpProcess {
	w.t.Helper()
	cmd := exec.Command(acpPath, "--", stubPath, "-log", w.stubLog, "-hold", w.holdFile)
	cmd.Env = append(os.Environ(),
		"BUZZ_RELAY_URL=ws://"+w.proxy.addr(),
		"BUZZ_PRIVATE_KEY="+w.agentKey.Hex(),
		"BUZZ_ACP_STATE_FILE="+stateFile,
		"BUZZ_ACP_HEALTH_ADDR=127.0.0.1:0",
		"BUZZ_ACP_MEMBERSHIP_REFRESH=200ms",
		"BUZZ_ACP_BACKOFF_MIN=20ms",
		"BUZZ_ACP_BACKOFF_MAX=500ms",
		"BUZZ_ACP_PROMPT_TIMEOUT=60s",
	)
	cmd.Env = append(cmd.Env, extraEnv...)
	cmd.Dir = w.t.TempDir()
	stderr, err := cmd.StderrPipe()
	require.NoError(w.t, err)
	cmd.Stdout = io.Discard
	require.NoError(w.t, cmd.Start())
	p := &acpProcess{t: w.t, cmd: cmd, exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.stderr = append(p.stderr, line)
			if i := strings.Index(line, `msg="health endpoint" addr=`); i >= 0 {
				p.health = "http://" + strings.TrimSpace(line[i+len(`msg="health endpoint" addr=`):]) + "/health"
			}
			p.mu.Unlock()
		}
		_ = cmd.Wait()
		close(p.exited)
	}()
	w.t.Cleanup(func() {
		p.kill()
		if w.t.Failed() {
			p.mu.Lock()
			w.t.Logf("buzz-acp stderr:\n%s", strings.Join(p.stderr, "\n"))
			p.mu.Unlock()
		}
	})
	return p
}

// status reads GET /health (zero before it answers).
func (p *acpProcess) status() statusLine {
	p.mu.Lock()
	url := p.health
	p.mu.Unlock()
	var s statusLine
	if url == "" {
		return s
	}
	resp, err := http.Get(url)
	if err != nil {
		return s
	}
	defer resp.Body.Close()
	_ = json.NewDecoder(resp.Body).Decode(&s)
	return s
}

func (p *acpProcess) waitConnected() {
	p.t.Helper()
	require.Eventually(p.t, func() bool { return p.status().State == "connected" }, waitLong, 20*time.Millisecond, "buzz-acp connects")
}

// kill ends the process with SIGKILL: nothing of it runs after.
func (p *acpProcess) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(waitLong):
		p.t.Error("buzz-acp did not die")
	}
}

// promptsFor counts the prompts the stub received for id (over every run).
func (w *world) promptsFor(id string) int {
	n := 0
	for _, p := range w.prompts() {
		if p.EventID == id {
			n++
		}
	}
	return n
}

// answersTo counts the answers to id stored in the channel.
func (w *world) answersTo(id string) int {
	n := 0
	for _, ev := range w.owner.Req("answers", map[string]any{"kinds": []int{9}, "#h": []string{w.channel}, "authors": []string{w.agentKey.PublicKeyHex()}}) {
		if strings.HasPrefix(ev.Content, "ack "+id+" in ") {
			n++
		}
	}
	return n
}

// requireOnce asserts each id was prompted and answered exactly once.
func (w *world) requireOnce(ids ...string) {
	w.t.Helper()
	for _, id := range ids {
		w.answerTo(id)
		require.Equal(w.t, 1, w.promptsFor(id), "the agent was asked once about %s", id)
		require.Equal(w.t, 1, w.answersTo(id), "one answer to %s", id)
	}
}

// requireOneAnswerWithoutAskingAgain checks, once everything replayed
// has been handled (flush), that the channel holds one answer to id and
// that the agent was not asked about it in this run.
func (w *world) requireOneAnswerWithoutAskingAgain(id string) {
	w.t.Helper()
	w.flush()
	require.Equal(w.t, 1, w.answersTo(id), "one answer")
	require.Zero(w.t, w.promptsFor(id), "the agent is not asked again")
}

// flush posts a mention and waits for its answer: the channel's session
// runs prompts in order, so anything replayed before it has been asked by
// then.
func (w *world) flush() {
	w.t.Helper()
	w.answerTo(w.mention("@Robby flush " + uuid.NewString()).ID)
}

// buzz-acp is killed (SIGKILL) while idle; a doorbell and mentions (one in
// a thread) are posted while it is down; after the restart each is answered
// exactly once, and what was answered before the kill is not asked again.
//
// Mutation killed: no cursor (the restart starts hearing at now, as before
// the state file): what came while it was down is never answered.
func TestRestartCatchesUpOnWhatCameWhileDown(t *testing.T) {
	t.Parallel()
	w := newStoppedWorld(t, nil)
	state := filepath.Join(t.TempDir(), "state.jsonl")
	first := w.launch(state)
	before := w.mention("@Robby before the crash")
	w.requireOnce(before.ID)
	first.kill()

	bell := w.ring()
	m := w.mention("@Robby while you were down")
	th := w.mention("@Robby in a thread", nostr.Tag{"e", before.ID, "", "root"})

	w.launch(state)
	w.requireOnce(bell.ID, m.ID, th.ID)
	w.flush()
	w.requireOnce(before.ID, bell.ID, m.ID, th.ID)
}

// A first run killed before anything named the agent has still written
// down where it started: what comes while it is down is answered after the
// restart.
//
// Mutation killed: writing down only the points of messages handled: the
// restart finds no point, starts at now, and the mention is never answered.
func TestFirstRunKilledBeforeAnyMessage(t *testing.T) {
	t.Parallel()
	w := newStoppedWorld(t, nil)
	state := filepath.Join(t.TempDir(), "state.jsonl")
	w.launch(state).kill()
	m := w.mention("@Robby while you were down")
	time.Sleep(1100 * time.Millisecond) // the restart starts in a later second
	w.launch(state)
	w.requireOnce(m.ID)
}

// Killed in the middle of a turn (the stub holds it), buzz-acp had posted
// nothing for that message: after the restart the message is asked again and
// answered once.
//
// Mutations killed: recording a message as handled when its turn starts
// (rather than when its answer is written down): the held message is never
// answered; writing the catch-up point of the later message without
// holding it back for the one still in its turn: the same.
func TestKilledMidTurnAsksAgain(t *testing.T) {
	t.Parallel()
	w := newStoppedWorld(t, nil)
	state := filepath.Join(t.TempDir(), "state.jsonl")
	first := w.launch(state)
	held := w.mention("@Robby [hold] a long job")
	require.Eventually(t, func() bool { return w.promptsFor(held.ID) == 1 }, waitLong, 10*time.Millisecond, "the turn starts")
	// A later message, in a session of its own (a thread), answered and
	// recorded while the held turn runs: the catch-up point written with it
	// stays at the held message, a second earlier.
	time.Sleep(1100 * time.Millisecond)
	later := w.mention("@Robby meanwhile", nostr.Tag{"e", held.ID, "", "root"})
	w.requireOnce(later.ID)
	first.kill()
	require.NoError(t, os.WriteFile(w.holdFile, nil, 0o600))

	w.launch(state)
	w.answerTo(held.ID)
	w.flush()
	require.Equal(t, 2, w.promptsFor(held.ID), "asked again: the first turn posted nothing")
	require.Equal(t, 1, w.answersTo(held.ID))
	w.requireOnce(later.ID)
}

// The worst moment: the answer reached the relay (it is stored), but
// buzz-acp was killed before it learnt so (the proxy withholds the relay's
// OK). After the restart the agent is not asked again: the answer written
// down before posting is posted again, the same event, which the relay
// takes as a duplicate.
//
// Mutation killed: not writing the answer down before posting it (only
// recording the message once the OK came): the restart asks the agent again.
func TestKilledAfterPostingDoesNotAnswerTwice(t *testing.T) {
	t.Parallel()
	w := newStoppedWorld(t, nil)
	state := filepath.Join(t.TempDir(), "state.jsonl")
	// The first OK on the connection is the AUTH's; the second the answer's.
	withheld := w.proxy.stallNext(`["OK",`, 2)
	first := w.launch(state)
	m := w.mention("@Robby answer, then die")
	select {
	case <-withheld:
	case <-time.After(waitLong):
		t.Fatal("the answer's OK never came")
	}
	require.Equal(t, 1, w.answersTo(m.ID), "the answer is stored")
	first.kill()

	second := w.launch(state)
	w.flush()
	w.requireOnce(m.ID)
	require.Eventually(t, func() bool { return second.status().Answers == 2 }, waitLong, 10*time.Millisecond,
		"the answer written down is posted again (a duplicate to the relay), and the flush's")
}

// A doorbell that woke the agent before a kill is spent for good: the
// relay ringing again for the same cause and step (another run; here a
// relay-signed copy with a new run id) after the restart wakes nobody.
//
// Mutation killed: not writing the spent replay key down (the verifier's
// memory starts empty at each start): the second doorbell is answered.
func TestSpentDoorbellStaysSpentAcrossRestart(t *testing.T) {
	t.Parallel()
	w := newStoppedWorld(t, nil)
	state := filepath.Join(t.TempDir(), "state.jsonl")
	first := w.launch(state)
	bell := w.ring()
	w.requireOnce(bell.ID)
	first.kill()

	again := w.resign(bell, func(tags nostr.Tags) nostr.Tags {
		out := nostr.Tags{}
		for _, tag := range tags {
			if tag[0] == "workflow-run" {
				tag = nostr.Tag{"workflow-run", uuid.NewString()}
			}
			out = append(out, tag)
		}
		return out
	})
	second := w.launch(state)
	require.Eventually(t, func() bool { return second.status().Dropped["duplicate"] == 1 }, waitLong, 10*time.Millisecond,
		"the second doorbell for the cause is a duplicate")
	w.flush()
	require.Zero(t, w.promptsFor(again.ID))
	w.requireOnce(bell.ID)
}

// resign posts a copy of a relay-signed event with its tags changed, signed
// with the community's relay key, the way the relay would ring again.
func (w *world) resign(ev *nostr.Event, change func(nostr.Tags) nostr.Tags) *nostr.Event {
	w.t.Helper()
	var communityID uuid.UUID
	require.NoError(w.t, w.r.Pool.QueryRow(context.Background(), `SELECT id FROM communities WHERE host = $1`, w.host).Scan(&communityID))
	raw, err := db.New(w.r.Pool).CommunitySigningKey(context.Background(), communityID)
	require.NoError(w.t, err)
	key, err := nostr.SecretKeyFromHex(hex.EncodeToString(raw))
	require.NoError(w.t, err)
	cp := &nostr.Event{Kind: ev.Kind, Content: ev.Content, Tags: change(ev.Tags), CreatedAt: time.Now().Unix()}
	require.NoError(w.t, cp.Sign(key))
	relay := w.r.Dial(w.t, w.host)
	relay.Auth(key)
	ok := relay.Publish(cp)
	require.True(w.t, ok.OK, ok.Msg)
	return cp
}

// A catch-up is bounded: messages older than BUZZ_ACP_CATCHUP_WINDOW, and
// beyond the BUZZ_ACP_CATCHUP_LIMIT newest, are skipped, and counted
// (dropped["catch_up_skipped"]) rather than silently lost. Here five
// mentions come while buzz-acp is down and the limit is two: the newest two
// are answered, the other three are counted, and so is the mention answered
// before the kill: the catch-up starts at its second (inclusive), and the
// count cannot tell a skipped message handled before from one never seen.
//
// Mutation killed: no count (countSkipped not run): the status shows no
// skipped messages.
func TestCatchUpIsBoundedAndCounted(t *testing.T) {
	t.Parallel()
	w := newStoppedWorld(t, nil)
	state := filepath.Join(t.TempDir(), "state.jsonl")
	first := w.launch(state)
	w.requireOnce(w.mention("@Robby hello").ID)
	first.kill()

	var asked []*nostr.Event
	for i := range 5 {
		asked = append(asked, w.owner.Sign(9, "@Robby while down", nostr.Tags{{"h", w.channel}, {"p", w.agentKey.PublicKeyHex()}}, time.Now().Unix()+int64(i)+1))
		ok := w.owner.Publish(asked[i])
		require.True(t, ok.OK, ok.Msg)
	}
	// The last one is dated ahead: wait until it is in the past, so the
	// catch-up counts it as due.
	time.Sleep(time.Until(time.Unix(asked[4].CreatedAt+2, 0)))
	second := w.launch(state, "BUZZ_ACP_CATCHUP_LIMIT=2")
	w.requireOnce(asked[3].ID, asked[4].ID)
	require.Eventually(t, func() bool { return second.status().Dropped["catch_up_skipped"] == 4 }, waitLong, 10*time.Millisecond,
		"three skipped, and the one answered before, counted: %v", second.status().Dropped)
	w.flush()
	for _, ev := range asked[:3] {
		require.Zero(t, w.promptsFor(ev.ID))
	}
}

// staleAnswerWorld is a stopped world on a relay whose writer refuses
// channel events dated more than a minute ago (a relay with a read replica
// refuses those dated more than created_at_lower_limit seconds ago, 960 by
// default, and advertises it), and a state file holding what a kill
// between writing an answer down and posting it leaves: a mention asked,
// and its answer, signed two floors back.
func staleAnswerWorld(t *testing.T) (w *world, state string, asked, answer *nostr.Event) {
	t.Helper()
	const floor = time.Minute
	pool := dbtest.PoolOn(t, dbtest.URL(t), 0, func(c *pgxpool.Config) { replica.ArmFloor(c, floor) })
	w = newStoppedWorldOn(t, pool, []func(*config.Config){func(c *config.Config) {
		// A reader that never answers: every read stays on the writer,
		// while the writer refuses channel events older than the floor
		// and NIP-11 advertises it, as with a real standby.
		c.ReadDatabaseURL = "postgres://postgres@127.0.0.1:1/buzz?sslmode=disable"
		c.CreatedAtFloor = floor
	}})
	asked = w.mention("@Robby asked before the kill")
	answer = &nostr.Event{Kind: 9, Content: "ack " + asked.ID + " in the run that was killed",
		Tags: nostr.Tags{{"h", w.channel}}, CreatedAt: time.Now().Add(-2 * floor).Unix()}
	require.NoError(t, answer.Sign(w.agentKey))
	state = filepath.Join(t.TempDir(), "state.jsonl")
	var lines []byte
	for _, r := range []record{
		{Since: asked.CreatedAt},
		{Event: asked.ID, CreatedAt: asked.CreatedAt, Answer: answer},
	} {
		b, err := json.Marshal(r)
		require.NoError(t, err)
		lines = append(append(lines, b...), '\n')
	}
	require.NoError(t, os.WriteFile(state, lines, 0o600))
	return w, state, asked, answer
}

// An answer written down before a kill and posted at the restart after an
// outage longer than the relay's created_at floor is signed again with the
// current time and posted once, without asking the agent again.
//
// Mutation killed: not signing it again (redatedPastFloor returning nil):
// the relay refuses the answer for good and the mention is never answered.
func TestAnswerWrittenDownBeforeAnOutageLongerThanTheFloorIsPosted(t *testing.T) {
	t.Parallel()
	w, state, asked, answer := staleAnswerWorld(t)
	w.launch(state)
	posted := w.answerTo(asked.ID)
	require.NotEqual(t, answer.ID, posted.ID, "the answer as first signed is refused")
	require.Equal(t, answer.Content, posted.Content)
	w.requireOneAnswerWithoutAskingAgain(asked.ID)
}

// The answer signed again is written down before it is posted, like the
// first: killed after the relay stored it but before buzz-acp read the OK
// (the proxy withholds it), the restart posts that same event again, a
// duplicate, and the channel holds one answer.
//
// Mutation killed: not writing the answer signed again down before posting
// it: the restart posts the one first signed, which the relay refuses again,
// and signs a third: two answers in the channel.
func TestKilledAfterPostingTheAnswerSignedAgainDoesNotAnswerTwice(t *testing.T) {
	t.Parallel()
	w, state, asked, _ := staleAnswerWorld(t)
	// The first OK on the connection is the AUTH's, the second the refusal
	// of the answer as first signed, the third the one signed again.
	withheld := w.proxy.stallNext(`["OK",`, 3)
	first := w.spawn(state)
	select {
	case <-withheld:
	case <-time.After(waitLong):
		t.Fatal("the OK of the answer signed again never came")
	}
	require.Equal(t, 1, w.answersTo(asked.ID), "the answer signed again is stored")
	first.kill()
	// A restart in the same second would sign a third answer identical to
	// the second (same content and created_at, so the same id).
	time.Sleep(1100 * time.Millisecond)

	second := w.launch(state)
	require.Eventually(t, func() bool { return second.status().Answers == 1 }, waitLong, 10*time.Millisecond,
		"the answer written down is posted again")
	w.requireOneAnswerWithoutAskingAgain(asked.ID)
}

// The answer signed again is posted only once it is written down: when the
// state file cannot keep it (here its file is closed behind the journal's
// back, as a failing disk would refuse the write), it is not posted, and
// the state file still holds the answer as first signed, which the next
// start signs again. Posted anyway, a kill before its done record would
// have the next start sign a third: two answers.
//
// Mutation killed: posting the answer signed again when writing it down
// failed (as before): it is stored.
func TestAnswerSignedAgainIsNotPostedUnwritten(t *testing.T) {
	t.Parallel()
	w, state, asked, answer := staleAnswerWorld(t)
	j, err := openJournal(state)
	require.NoError(t, err)
	require.NoError(t, j.f.Close()) // every later write fails
	st := newStatus(nil, "ws://"+w.proxy.addr(), w.agentKey.PublicKeyHex())
	b := newBridge(settings{Key: w.agentKey, IncomingQueue: 1, BackoffMin: 20 * time.Millisecond, BackoffMax: 500 * time.Millisecond},
		nil, j, slog.New(slog.DiscardHandler), st)
	b.limits = answerLimits{createdAtFloor: int64(time.Minute / time.Second)}.orDefaults()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	conn, err := dialRelay(ctx, "ws://"+w.proxy.addr(), w.agentKey, nil)
	require.NoError(t, err)
	defer conn.close()
	b.setConn(conn)

	b.postAnswer(ctx, asked.ID, asked.CreatedAt, answer, "")
	require.Zero(t, w.answersTo(asked.ID), "nothing posted")
	require.EqualValues(t, 1, st.snapshot().Failures)
	j.close()
	j, err = openJournal(state)
	require.NoError(t, err)
	defer j.close()
	require.Equal(t, answer.ID, j.unposted()[asked.ID].ID, "the answer as first signed is still written down")
}
