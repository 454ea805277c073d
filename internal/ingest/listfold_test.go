package ingest_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// foldProcess is one "relay process" on the fixture's database: its own
// pool and pipeline, folding lists from foldMembers members, recording the
// members lists it publishes.
type foldProcess struct {
	p     *ingest.Pipeline
	mu    sync.Mutex
	lists []*nostr.Event
}

func (f *fixture) foldProcess(foldMembers int, interval time.Duration) *foldProcess {
	f.t.Helper()
	return f.foldProcessWith(ingest.Options{MaxFutureSkew: 10 * time.Minute, ListFoldMembers: foldMembers, ListFoldInterval: interval})
}

func (f *fixture) foldProcessWith(opts ingest.Options) *foldProcess {
	f.t.Helper()
	pool := dbtest.PoolOn(f.t, f.pool.Config().ConnString(), 8)
	fp := &foldProcess{p: ingest.New(pool, fanout.NewHub(), opts)}
	fp.p.OnPublish = func(_ uuid.UUID, ev *nostr.Event, _ *uuid.UUID, _ int64) {
		if ev.Kind == ingest.KindGroupMembers {
			fp.mu.Lock()
			fp.lists = append(fp.lists, ev)
			fp.mu.Unlock()
		}
	}
	return fp
}

func (fp *foldProcess) published() []*nostr.Event {
	fp.mu.Lock()
	defer fp.mu.Unlock()
	return slices.Clone(fp.lists)
}

// storedList is the channel's members list a REQ returns (nil: none).
func (f *fixture) storedList(ch string) *nostr.Event {
	f.t.Helper()
	var got []*nostr.Event
	require.NoError(f.t, eventstore.New(f.pool, 100).QueryJSON(f.ctx, f.tenant.ID(), eventstore.Scope{Channels: []uuid.UUID{uuid.MustParse(ch)}},
		nostr.Filters{{Kinds: []int{ingest.KindGroupMembers}, Tags: map[string][]string{"d": {ch}}}}, func(raw []byte, _ *uuid.UUID) error {
			ev, err := nostr.ParseEvent(raw, nostr.Limits{})
			got = append(got, ev)
			return err
		}))
	require.LessOrEqual(f.t, len(got), 1)
	if len(got) == 0 {
		return nil
	}
	return got[0]
}

func listed(ev *nostr.Event) []string {
	members := ev.Tags.Values("p")
	slices.Sort(members)
	return members
}

func (f *fixture) activeMembers(ch string) []string {
	f.t.Helper()
	rows, err := f.pool.Query(f.ctx, `SELECT encode(pubkey, 'hex') FROM channel_members WHERE channel_id = $1 AND removed_at IS NULL ORDER BY 1`, ch)
	require.NoError(f.t, err)
	var out []string
	for rows.Next() {
		var k string
		require.NoError(f.t, rows.Scan(&k))
		out = append(out, k)
	}
	require.NoError(f.t, rows.Err())
	return out
}

// Below the bound a join's members list is in its own transaction (a REQ
// after the OK lists the joiner); from the bound on, the join only marks
// the channel, the stored list stays as it was, and one fold writes (and
// publishes) one list naming every member, however many changes it folds.
// Mutations killed: writing the lists in every change's transaction (the
// list changes before the fold); never marking (the fold writes nothing).
func TestLargeChannelListsAreFoldedIntoOneWrite(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "fold.example", 0)
	fp := f.foldProcess(3, time.Nanosecond)
	f.p = fp.p
	owner, first := f.key(), f.key()
	ch := f.channel(owner, false)
	f.store(f.sign(first, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0))
	require.Len(t, listed(f.storedList(ch)), 2, "two members: the join's own transaction wrote the list")
	before := f.storedList(ch)

	var joiners []*nostr.SecretKey
	for range 3 {
		k := f.key()
		joiners = append(joiners, k)
		f.store(f.sign(k, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0))
	}
	f.store(f.sign(joiners[0], ingest.KindLeaveRequest, "", nostr.Tags{{"h", ch}}, 0))
	require.Equal(t, before.ID, f.storedList(ch).ID, "a change of a channel at the bound leaves its list to the fold")
	require.Equal(t, 1, f.count(`SELECT count(*) FROM channel_lists_due WHERE channel_id = $1`, ch))

	published := len(fp.published())
	n, err := fp.p.FoldChannelLists(f.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "four changes, one fold")
	after := f.storedList(ch)
	require.Equal(t, f.activeMembers(ch), listed(after))
	require.Len(t, listed(after), 4)
	require.Greater(t, after.CreatedAt, before.CreatedAt)
	require.Zero(t, f.count(`SELECT count(*) FROM channel_lists_due`))
	lists := fp.published()
	require.Len(t, lists, published+1, "the folded list is published like any list")
	require.Equal(t, after.ID, lists[len(lists)-1].ID)

	n, err = fp.p.FoldChannelLists(f.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing changed since")
}

// A mark is due one interval after the first change it holds: a flood of
// changes to one large channel writes its lists at most once an interval.
// Mutation killed: a mark due at once (the fold writes before the interval).
func TestFoldedListWaitsForItsInterval(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "fold-interval.example", 0)
	fp := f.foldProcess(2, time.Hour)
	f.p = fp.p
	owner := f.key()
	ch := f.channel(owner, false)
	f.store(f.sign(f.key(), ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0))
	n, err := fp.p.FoldChannelLists(f.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "not due for an hour")
	require.Equal(t, 1, f.count(`SELECT count(*) FROM channel_lists_due WHERE channel_id = $1 AND due_at > now() + interval '59 minutes'`, ch))
}

// Two relay processes on one database: while one holds a channel's mark
// (between its claim and its commit), the other's fold skips it and writes
// nothing; when the first commits, its list is the one stored. Mutation
// killed: a claim without FOR UPDATE SKIP LOCKED (the second process writes
// the same channel's lists at once, or waits for the first).
func TestOneProcessWritesAChannelsFoldedLists(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "fold-two.example", 0)
	a, b := f.foldProcess(2, time.Nanosecond), f.foldProcess(2, time.Nanosecond)
	f.p = a.p
	owner := f.key()
	ch := f.channel(owner, false)
	f.store(f.sign(f.key(), ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0))

	claimed, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	releaseA := func() { releaseOnce.Do(func() { close(release) }) }
	defer releaseA() // a failed assertion must not leave process a waiting
	ingest.OnListClaimed(a.p, func() { close(claimed); <-release })
	done := make(chan error, 1)
	go func() {
		n, err := a.p.FoldChannelLists(f.ctx)
		if err == nil && n != 1 {
			err = fmt.Errorf("process a wrote %d lists", n)
		}
		done <- err
	}()
	<-claimed
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	n, err := b.p.FoldChannelLists(ctx)
	cancel()
	require.NoError(t, err)
	require.Zero(t, n, "the mark process a holds is not process b's to write")
	releaseA()
	require.NoError(t, <-done)
	require.Empty(t, b.published())
	require.Equal(t, f.activeMembers(ch), listed(f.storedList(ch)))
}

// A process killed after claiming a mark (its backend terminated before it
// commits) leaves the mark: another process writes the lists. Mutation
// killed: a claim that takes the mark away in its own committed step before
// writing (the lists would never be written).
func TestAKilledFolderLeavesItsMarkToAnother(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "fold-killed.example", 0)
	a, b := f.foldProcess(2, time.Nanosecond), f.foldProcess(2, time.Nanosecond)
	f.p = a.p
	owner, joiner := f.key(), f.key()
	ch := f.channel(owner, false)
	f.store(f.sign(joiner, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0))
	before := f.storedList(ch)
	ingest.OnListClaimed(a.p, func() {
		// Kill the backend that holds the mark, as a crash of its process
		// (or a lost connection) would.
		var killed int
		require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
			WHERE relation = 'channel_lists_due'::regclass AND mode = 'RowShareLock' AND pid <> pg_backend_pid()
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&killed))
		require.Equal(t, 1, killed)
	})
	_, err := a.p.FoldChannelLists(f.ctx)
	require.Error(t, err, "process a died before its commit")
	require.Equal(t, before.ID, f.storedList(ch).ID)

	n, err := b.p.FoldChannelLists(f.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, f.activeMembers(ch), listed(f.storedList(ch)))
	require.Len(t, b.published(), 1)
}

// Many keys join and leave one large channel from many goroutines while two
// processes fold its lists over and over: once the changes and a last fold
// are done, the stored list names exactly the active members, and every
// list published was dated after the one before it. Mutation killed:
// reading the members without the channel's row lock (a change that
// commits just after the fold read them finds the mark still there, adds
// nothing to it, and the fold deletes it: the list lacks that change for
// good).
func TestConcurrentChangesAndTwoFoldersEndWithTheCurrentList(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "fold-race.example", 24)
	a, b := f.foldProcess(2, time.Nanosecond), f.foldProcess(2, time.Nanosecond)
	f.p = a.p
	owner := f.key()
	ch := f.channel(owner, false)

	stop := make(chan struct{})
	var folders sync.WaitGroup
	for _, fp := range []*foldProcess{a, b} {
		folders.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := fp.p.FoldChannelLists(f.ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	var joiners sync.WaitGroup
	for g := range 16 {
		joiners.Go(func() {
			for i := range 6 {
				k := f.key()
				ev := f.sign(k, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0)
				pipeline := a.p
				if g%2 == 1 {
					pipeline = b.p
				}
				if _, err := pipeline.Submit(f.ctx, f.tenant, ev.PubKey, ev); err != nil {
					t.Error(err)
					return
				}
				if i%3 == 2 {
					leave := f.sign(k, ingest.KindLeaveRequest, "", nostr.Tags{{"h", ch}}, 0)
					if _, err := pipeline.Submit(f.ctx, f.tenant, leave.PubKey, leave); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	joiners.Wait()
	close(stop)
	folders.Wait()
	_, err := a.p.FoldChannelLists(f.ctx)
	require.NoError(t, err)
	require.Equal(t, f.activeMembers(ch), listed(f.storedList(ch)))
	require.Len(t, f.activeMembers(ch), 1+16*4)

	// Each process publishes in its commit order; across both, the lists'
	// dates are distinct (each after the one it replaced).
	seen := map[int64]bool{}
	for _, fp := range []*foldProcess{a, b} {
		lists := fp.published()
		for i, l := range lists {
			require.False(t, seen[l.CreatedAt], "two lists dated %d", l.CreatedAt)
			seen[l.CreatedAt] = true
			if i > 0 {
				require.Greater(t, l.CreatedAt, lists[i-1].CreatedAt)
			}
		}
	}
}

// A fold that fails (here its backend is killed; in life, say, a list too
// large to write within the write timeout) puts its mark off one interval,
// so the marks behind it are written on the next pass rather than held up
// behind the oldest for as long as it fails. Mutation killed: leaving a
// failed mark's due_at as it was.
func TestAFailedFoldPutsItsMarkOff(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "fold-postpone.example", 0)
	fp := f.foldProcess(2, time.Hour)
	f.p = fp.p
	owner := f.key()
	failing, next := f.channel(owner, false), f.channel(owner, false)
	for _, ch := range []string{failing, next} {
		f.store(f.sign(f.key(), ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0))
	}
	_, err := f.pool.Exec(f.ctx, `UPDATE channel_lists_due SET due_at = now() - CASE WHEN channel_id = $1 THEN interval '2 minutes' ELSE interval '1 minute' END`, failing)
	require.NoError(t, err)
	killed := false
	ingest.OnListClaimed(fp.p, func() {
		if killed {
			return
		}
		killed = true
		_, err := f.pool.Exec(f.ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks
			WHERE relation = 'channel_lists_due'::regclass AND mode = 'RowShareLock' AND pid <> pg_backend_pid()
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
		require.NoError(t, err)
	})
	_, err = fp.p.FoldChannelLists(f.ctx)
	require.Error(t, err)
	require.Equal(t, 1, f.count(`SELECT count(*) FROM channel_lists_due WHERE channel_id = $1 AND due_at > now() + interval '59 minutes'`, failing),
		"the failed mark is put off an interval")
	n, err := fp.p.FoldChannelLists(f.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the next pass writes the mark behind it")
	require.Equal(t, f.activeMembers(next), listed(f.storedList(next)))
}

// A membership change in flight when a fold claims its channel's mark (it
// holds the channel's row lock, its member row written, and found the mark
// already there): the fold waits for it, so its list names the new member.
// Mutation killed: the fold reading the members without taking the
// channel's row lock (it writes the list without the member and deletes
// the mark the change counted on: the list lacks the member for good).
func TestFoldWaitsForAChangeInFlight(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "fold-inflight.example", 0)
	fp := f.foldProcess(2, time.Nanosecond)
	f.p = fp.p
	owner := f.key()
	ch := f.channel(owner, false)
	f.store(f.sign(f.key(), ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0))
	late := f.key()

	folded := make(chan struct{})
	committed := make(chan error, 1)
	ingest.OnListClaimed(fp.p, func() {
		// The change, as a join writes it, up to its commit.
		tx, err := f.pool.Begin(f.ctx)
		require.NoError(t, err)
		_, err = tx.Exec(f.ctx, `SELECT 1 FROM channels WHERE id = $1 FOR NO KEY UPDATE`, ch)
		require.NoError(t, err)
		_, err = tx.Exec(f.ctx, `INSERT INTO channel_members (community_id, channel_id, pubkey) VALUES ($1, $2, decode($3, 'hex'))`, f.tenant.ID(), ch, late.PublicKeyHex())
		require.NoError(t, err)
		_, err = tx.Exec(f.ctx, `INSERT INTO channel_lists_due (community_id, channel_id, due_at) VALUES ($1, $2, now()) ON CONFLICT DO NOTHING`, f.tenant.ID(), ch)
		require.NoError(t, err)
		go func() {
			// Commit once the fold waits for a lock (or has finished).
			for {
				var waiting bool
				if err := f.pool.QueryRow(f.ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
					WHERE wait_event_type = 'Lock' AND datname = current_database())`).Scan(&waiting); err != nil {
					committed <- err
					return
				}
				select {
				case <-folded:
					waiting = true
				default:
				}
				if waiting {
					committed <- tx.Commit(f.ctx)
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	})
	_, err := fp.p.FoldChannelLists(f.ctx)
	close(folded)
	require.NoError(t, err)
	require.NoError(t, <-committed)
	require.Contains(t, listed(f.storedList(ch)), late.PublicKeyHex(), "the list names the member whose change the fold waited for")
}

// A membership change arriving while a large channel's lists are folded
// waits for the fold, and a message into the channel sent after it is
// stored meanwhile: the change takes the channel's row before its write
// lock, so while it waits for the fold's row it holds no place in the write
// lock's queue that the message's shared request would wait behind. The
// fold here holds its row until the message is answered; waiting is seen
// in pg_stat_activity, never timed.
// Mutation killed: the change taking the write lock before the row, as
// before (the fold held it shared, so the change queued there and the
// message behind it, for the rest of the fold).
func TestMessageIsNotHeldByAChangeWaitingForAFold(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "fold-message.example", 0)
	folder, changer := f.foldProcess(2, time.Nanosecond), f.foldProcess(2, time.Nanosecond)
	f.p = folder.p
	owner := f.key()
	ch := f.channel(owner, false)
	f.store(f.sign(f.key(), ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0))

	locked, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	releaseFold := func() { releaseOnce.Do(func() { close(release) }) }
	defer releaseFold() // a failed assertion must not leave the fold waiting
	ingest.OnListsLocked(folder.p, func() { close(locked); <-release })
	folded := make(chan error, 1)
	go func() {
		n, err := folder.p.FoldChannelLists(f.ctx)
		if err == nil && n != 1 {
			err = fmt.Errorf("folded %d channels", n)
		}
		folded <- err
	}()
	<-locked

	joiner := f.key()
	join := f.sign(joiner, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0)
	joined := make(chan error, 1)
	go func() {
		_, err := changer.p.Submit(f.ctx, f.tenant, join.PubKey, join)
		joined <- err
	}()
	f.waitForLockWaiters(1, "the join does not wait for the fold in progress")

	message := f.sign(owner, 9, "while the lists are folded", nostr.Tags{{"h", ch}}, 0)
	type answer struct {
		outcome ingest.Outcome
		err     error
	}
	answered := make(chan answer, 1)
	go func() {
		outcome, err := f.submit(message)
		answered <- answer{outcome, err}
	}()
	var got answer
	var waited atomic.Bool
	require.Eventually(t, func() bool {
		select {
		case got = <-answered:
			return true
		default:
		}
		if f.lockWaiters() == 2 {
			waited.Store(true)
			return true
		}
		return false
	}, 30*time.Second, 2*time.Millisecond, "the message neither waits nor is answered")
	require.False(t, waited.Load(), "the message waits behind the join waiting for the fold")
	require.NoError(t, got.err)
	require.Equal(t, ingest.Stored, got.outcome)
	select {
	case err := <-joined:
		require.Fail(t, "the join did not wait for the fold", "%v", err)
	default:
	}

	releaseFold()
	require.NoError(t, <-folded)
	require.NoError(t, <-joined)
	require.Contains(t, f.activeMembers(ch), joiner.PublicKeyHex())
}
