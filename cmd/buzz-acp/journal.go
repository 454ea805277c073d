package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/buzzrelay/buzz/internal/doorbell"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// journal is buzz-acp's memory across restarts (BUZZ_ACP_STATE_FILE): where
// the next catch-up starts, the messages already handled, the answers signed
// but not yet known to be posted, and the doorbell replay keys spent. It is
// a file of JSON lines, each appended and synced before what it records
// counts as done, and rewritten compactly at start and when it grows.
//
// The order is what makes a restart safe, even after kill -9: an answer is
// written down (signed, whole) before it is posted, so a process that died
// after posting it only posts the same event again, which the relay takes as
// a duplicate; a message whose turn had not produced a written-down answer
// is handled again. The catch-up point written down never passes a message
// still waiting or in a turn.
//
// Without a state file it keeps nothing: every method is a no-op.
type journal struct {
	mu      sync.Mutex
	path    string
	durable bool // there is a state file (fixed at open)
	f       *os.File
	lock    *os.File
	// lines written since the last compaction, and live records then.
	lines, live int
	// size is the length of the file's whole lines: the next line is
	// written there, over whatever a failed append left behind.
	size int64

	since    int64                   // the catch-up point written down
	memSince int64                   // the one the connection moved to
	handled  map[string]int64        // event id -> its created_at, for pruning
	pending  map[string]*nostr.Event // asking event id -> its signed answer
	spent    map[string]time.Time    // doorbell replay key -> when it woke the agent
	inflight map[string]*flight      // accepted, not yet released
}

type flight struct {
	point int64
	refs  int
}

// record is one line of the journal. A line with Answer says an answer to
// Event was signed and is about to be posted; one with Done, that Event is
// handled; Spent rides on either.
type record struct {
	Since     int64        `json:"since,omitempty"`
	Event     string       `json:"event,omitempty"`
	CreatedAt int64        `json:"created_at,omitempty"`
	Answer    *nostr.Event `json:"answer,omitempty"`
	Done      bool         `json:"done,omitempty"`
	Spent     string       `json:"spent,omitempty"`
	SpentAt   int64        `json:"spent_at,omitempty"`
}

// compactAfter is how many lines beyond the live records the file may grow
// before it is rewritten.
const compactAfter = 10000

func openJournal(path string) (*journal, error) {
	j := &journal{path: path, handled: map[string]int64{}, pending: map[string]*nostr.Event{},
		spent: map[string]time.Time{}, inflight: map[string]*flight{}}
	if path == "" {
		return j, nil
	}
	// One process per state file: two would each answer what the other
	// missed. The lock is on a file beside it, since compaction replaces
	// the state file itself; the kernel drops it when the process dies.
	lock, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state file lock: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("state file %s is in use by another buzz-acp: %w", path, err)
	}
	j.lock, j.durable = lock, true
	if err := j.load(); err != nil {
		j.close()
		return nil, err
	}
	j.memSince = j.since
	if err := j.compactLocked(time.Now()); err != nil {
		j.close()
		return nil, err
	}
	return j, nil
}

// load reads the records in order. A last line cut short (the machine lost
// power mid-write) is ignored: what it recorded never counted as done.
func (j *journal) load() error {
	data, err := os.ReadFile(j.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	lines := bytes.Split(data, []byte("\n"))
	for n, line := range lines {
		if len(line) == 0 {
			continue
		}
		var r record
		if err := json.Unmarshal(line, &r); err != nil {
			if n == len(lines)-1 {
				break // no newline after it: the torn last line
			}
			return fmt.Errorf("state file %s line %d: %w", j.path, n+1, err)
		}
		j.applyLocked(r)
	}
	return nil
}

func (j *journal) applyLocked(r record) {
	j.since = max(j.since, r.Since)
	if r.Spent != "" {
		j.spent[r.Spent] = time.Unix(r.SpentAt, 0)
	}
	if r.Event == "" {
		return
	}
	j.handled[r.Event] = r.CreatedAt
	if r.Answer != nil && !r.Done {
		j.pending[r.Event] = r.Answer
	}
	if r.Done {
		delete(j.pending, r.Event)
	}
}

// compactLocked rewrites the file with only what still matters: handled
// messages a catch-up from the point written down could bring again, the
// answers not yet posted, and the replay keys younger than the verifier's
// memory.
func (j *journal) compactLocked(now time.Time) error {
	var recs []record
	recs = append(recs, record{Since: j.since})
	for id, created := range j.handled {
		if _, waiting := j.pending[id]; waiting {
			continue
		}
		if created < j.since {
			delete(j.handled, id) // the catch-up starts after it
			continue
		}
		recs = append(recs, record{Event: id, CreatedAt: created, Done: true})
	}
	for id, ans := range j.pending {
		recs = append(recs, record{Event: id, CreatedAt: j.handled[id], Answer: ans})
	}
	for key, at := range j.spent {
		if now.Sub(at) >= doorbell.DefaultDedupeTTL {
			delete(j.spent, key)
			continue
		}
		recs = append(recs, record{Spent: key, SpentAt: at.Unix()})
	}
	var buf bytes.Buffer
	for _, r := range recs {
		b, _ := json.Marshal(r)
		buf.Write(append(b, '\n'))
	}
	tmp := j.path + ".tmp"
	if err := writeSynced(tmp, buf.Bytes()); err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	if j.f != nil {
		j.f.Close()
		j.f = nil
	}
	if err := os.Rename(tmp, j.path); err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	if dir, err := os.Open(filepath.Dir(j.path)); err == nil {
		_ = dir.Sync()
		dir.Close()
	}
	f, err := os.OpenFile(j.path, os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	j.f, j.lines, j.live, j.size = f, 0, len(recs), int64(buf.Len())
	return nil
}

func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// appendLocked writes r and syncs it; it applies r only once it is on disk.
func (j *journal) appendLocked(r record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	// Written at the end of the last whole line, not appended: a write cut
	// short (a full disk) leaves part of a line, which the next line would
	// otherwise follow on the same line, so that load refused the file and
	// lost the next record with it. The next line overwrites that part; the
	// truncation is only tidiness.
	line := append(b, '\n')
	if _, err := j.f.WriteAt(line, j.size); err != nil {
		_ = j.f.Truncate(j.size)
		return fmt.Errorf("state file: %w", err)
	}
	if err := j.f.Sync(); err != nil {
		_ = j.f.Truncate(j.size)
		return fmt.Errorf("state file: %w", err)
	}
	j.size += int64(len(line))
	j.applyLocked(r)
	j.lines++
	if j.lines > j.live+compactAfter {
		return j.compactLocked(time.Now())
	}
	return nil
}

func (j *journal) close() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f != nil {
		j.f.Close()
		j.f = nil
	}
	if j.lock != nil {
		j.lock.Close()
		j.lock = nil
	}
}

// resumeFrom is the catch-up point of the last run, or 0 when there is none.
func (j *journal) resumeFrom() int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.since
}

// startAt writes down where a first run starts hearing, so a restart before
// it handled anything still catches up from there.
func (j *journal) startAt(since int64) error {
	if !j.durable {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.since != 0 {
		return nil
	}
	j.memSince = since
	return j.appendLocked(record{Since: since})
}

// spentKeys are the doorbell replay keys already spent, for the verifier.
func (j *journal) spentKeys() map[string]time.Time {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := make(map[string]time.Time, len(j.spent))
	for k, v := range j.spent {
		out[k] = v
	}
	return out
}

// unposted are the answers written down whose posting was not confirmed.
func (j *journal) unposted() map[string]*nostr.Event {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := make(map[string]*nostr.Event, len(j.pending))
	for k, v := range j.pending {
		out[k] = v
	}
	return out
}

// handledBefore reports whether an earlier run handled id (or wrote down
// its answer, posted at start).
func (j *journal) handledBefore(id string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	_, ok := j.handled[id]
	return ok
}

// createdAt is the created_at recorded for a handled message.
func (j *journal) createdAt(id string) int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.handled[id]
}

// accept notes a message handed on at point: the catch-up point written
// down stays at or before it until it is released.
func (j *journal) accept(id string, point int64) {
	if !j.durable {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.memSince = max(j.memSince, point)
	fl := j.inflight[id]
	if fl == nil {
		fl = &flight{point: point}
		j.inflight[id] = fl
	}
	fl.point = min(fl.point, point)
	fl.refs++
}

// release says one acceptance of id needs nothing written down: it was
// dropped or skipped, or handled by another acceptance.
func (j *journal) release(id string) error {
	if !j.durable {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.releaseLocked(id)
	if s := j.durableSinceLocked(); s > j.since {
		return j.appendLocked(record{Since: s})
	}
	return nil
}

func (j *journal) releaseLocked(id string) {
	if fl := j.inflight[id]; fl != nil {
		if fl.refs--; fl.refs <= 0 {
			delete(j.inflight, id)
		}
	}
}

// durableSinceLocked is the furthest the catch-up point may be written:
// never past a message still waiting or in a turn.
func (j *journal) durableSinceLocked() int64 {
	s := j.memSince
	for _, fl := range j.inflight {
		s = min(s, fl.point)
	}
	return s
}

// answering writes down the signed answer to ev before it is posted (and the
// doorbell replay key the turn spent).
func (j *journal) answering(id string, createdAt int64, answer *nostr.Event, replayKey string) error {
	if !j.durable {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	r := record{Event: id, CreatedAt: createdAt, Answer: answer}
	if replayKey != "" {
		r.Spent, r.SpentAt = replayKey, time.Now().Unix()
	}
	return j.appendLocked(r)
}

// done writes down that ev is handled: its answer posted, or its turn ended
// without one. It also releases it.
func (j *journal) done(id string, createdAt int64, replayKey string) error {
	if !j.durable {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.releaseLocked(id)
	r := record{Event: id, CreatedAt: createdAt, Done: true, Since: j.durableSinceLocked()}
	if replayKey != "" {
		r.Spent, r.SpentAt = replayKey, time.Now().Unix()
	}
	return j.appendLocked(r)
}
