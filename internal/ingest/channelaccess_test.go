package ingest_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// A channel check that waits for a removal of its pubkey in progress
// (holding the channel's locks, as every membership change does) answers
// with the state that removal committed: no role, and the readers version
// it wrote. Otherwise a write checked under a removal in flight was stored
// after it as the removed member's, and fanned out from a reader set older
// than its commit.
// Mutations killed: ChannelAccess without its write lock (the check does
// not wait, and answers while the removal is still uncommitted: this
// test's "does not wait" assertion); the read before the lock (the role
// read before the removal committed comes back).
func TestChannelAccessWaitingForARemovalSeesIt(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "access.example", 4)
	owner, member := f.key(), f.key()
	ch := f.channel(owner, true)
	f.store(f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}}, 0))
	channel := uuid.MustParse(ch)
	memberBytes, _ := hex.DecodeString(member.PublicKeyHex())
	params := db.ChannelAccessParams{CommunityID: f.tenant.ID(), ID: channel, Pubkey: memberBytes}
	before, err := ingest.ChannelAccess(f.ctx, db.New(f.pool), params)
	require.NoError(t, err)
	require.NotNil(t, before.MemberRole)

	removal, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = removal.Rollback(f.ctx) }()
	rq := db.New(removal)
	_, err = ingest.ChannelLockForChange(f.ctx, rq, f.tenant.ID(), channel)
	require.NoError(t, err)
	removed, err := rq.ChannelMemberRemove(f.ctx, db.ChannelMemberRemoveParams{CommunityID: f.tenant.ID(), ChannelID: channel, Pubkey: memberBytes, RemovedBy: memberBytes})
	require.NoError(t, err)
	require.EqualValues(t, 1, removed)

	write, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = write.Rollback(f.ctx) }()
	type answer struct {
		row db.ChannelAccessRow
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		row, err := ingest.ChannelAccess(f.ctx, db.New(write), params)
		answered <- answer{row, err}
	}()
	f.waitForLockWaiters(1, "the check does not wait for the removal in progress")
	require.NoError(t, removal.Commit(f.ctx))
	got := <-answered
	require.NoError(t, got.err)
	require.Nil(t, got.row.MemberRole, "the check answered with the role the removal took away")
	require.Greater(t, got.row.ReadersVersion, before.ReadersVersion)
}

// waitForLockWaiters waits until n sessions of the test's database wait for
// a lock.
func (f *fixture) waitForLockWaiters(n int, msg string) {
	f.t.Helper()
	require.Eventually(f.t, func() bool { return f.lockWaiters() == n }, 30*time.Second, 5*time.Millisecond, msg)
}

func (f *fixture) lockWaiters() int {
	return f.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`)
}

type accessAnswer struct {
	row db.ChannelAccessRow
	err error
}

// checkInTx runs ChannelAccess in a new transaction of the test's pool on
// its own goroutine; the transaction stays open (the test rolls it back).
func (f *fixture) checkInTx(params db.ChannelAccessParams) (pgx.Tx, chan accessAnswer) {
	f.t.Helper()
	tx, err := f.pool.Begin(f.ctx)
	require.NoError(f.t, err)
	f.t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	answered := make(chan accessAnswer, 1)
	go func() {
		row, err := ingest.ChannelAccess(f.ctx, db.New(tx), params)
		answered <- accessAnswer{row, err}
	}()
	return tx, answered
}

// A membership change waiting for the writes in flight into its channel is
// not passed by writes that come after it: they wait behind it. Otherwise a
// steady flow of messages (fresh keys cost nothing) kept an owner's removal
// or turn-private waiting until it timed out.
// Mutation killed: the check's lock a FOR KEY SHARE row lock and the
// change's the FOR UPDATE row lock alone, as before (row locks are not
// queued: the later check is granted at once, beside the one held).
func TestChannelChangeWaitingIsNotPassedByLaterWrites(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "access-fair.example", 6)
	owner, writer := f.key(), f.key()
	ch := f.channel(owner, false)
	channel := uuid.MustParse(ch)
	writerBytes, _ := hex.DecodeString(writer.PublicKeyHex())
	params := db.ChannelAccessParams{CommunityID: f.tenant.ID(), ID: channel, Pubkey: writerBytes}

	first, firstAnswer := f.checkInTx(params)
	got := <-firstAnswer
	require.NoError(t, got.err)

	change, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = change.Rollback(context.Background()) }()
	changed := make(chan error, 1)
	go func() {
		_, err := ingest.ChannelLockForChange(f.ctx, db.New(change), f.tenant.ID(), channel)
		changed <- err
	}()
	f.waitForLockWaiters(1, "the change does not wait for the write in flight")

	_, laterAnswer := f.checkInTx(params)
	var passed atomic.Bool
	require.Eventually(t, func() bool {
		select {
		case <-laterAnswer:
			passed.Store(true)
			return true
		default:
		}
		return f.lockWaiters() == 2
	}, 30*time.Second, 5*time.Millisecond, "the later write neither waits nor answers")
	require.False(t, passed.Load(), "a later write passed the change waiting for the channel")

	require.NoError(t, first.Commit(f.ctx))
	require.NoError(t, <-changed, "the change goes first once the write in flight commits")
	f.waitForLockWaiters(1, "the later write does not wait behind the change")
	select {
	case <-laterAnswer:
		require.Fail(t, "the later write went on while the change held the channel")
	default:
	}
	require.NoError(t, change.Commit(f.ctx))
	got = <-laterAnswer
	require.NoError(t, got.err)
}

// A check that waited for a role change in progress answers with the new
// role. A role change of an active member writes no new readers version,
// so nothing told a check that waited on a row lock to read again: a
// just-demoted admin's workflow definition calling outside the relay was
// accepted.
// Mutations killed: the row lock with its version re-read, as before (the
// admin role comes back); the read before the lock (likewise).
func TestChannelAccessWaitingForADemotionSeesIt(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "access-demote.example", 4)
	owner, admin := f.key(), f.key()
	ch := f.channel(owner, true)
	f.store(f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", ch}, {"p", admin.PublicKeyHex(), "admin"}}, 0))
	channel := uuid.MustParse(ch)
	adminBytes, _ := hex.DecodeString(admin.PublicKeyHex())
	params := db.ChannelAccessParams{CommunityID: f.tenant.ID(), ID: channel, Pubkey: adminBytes}
	before, err := ingest.ChannelAccess(f.ctx, db.New(f.pool), params)
	require.NoError(t, err)
	require.NotNil(t, before.MemberRole)
	require.Equal(t, db.MemberRoleAdmin, *before.MemberRole)

	demotion, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = demotion.Rollback(context.Background()) }()
	dq := db.New(demotion)
	_, err = ingest.ChannelLockForChange(f.ctx, dq, f.tenant.ID(), channel)
	require.NoError(t, err)
	member := db.MemberRoleMember
	n, err := dq.ChannelMemberUpsert(f.ctx, db.ChannelMemberUpsertParams{CommunityID: f.tenant.ID(), ChannelID: channel, Pubkey: adminBytes, Role: &member, MaxMembers: 1000})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)

	_, answered := f.checkInTx(params)
	f.waitForLockWaiters(1, "the check does not wait for the role change in progress")
	require.NoError(t, demotion.Commit(f.ctx))
	got := <-answered
	require.NoError(t, got.err)
	require.NotNil(t, got.row.MemberRole)
	require.Equal(t, db.MemberRoleMember, *got.row.MemberRole, "the check answered with the role the change took away")
}

// A membership or metadata change is committed in a group of its own: the
// group would already hold the channel's write lock shared for its
// messages, and two groups each holding it and then asking it exclusive
// for a change wait on each other until the lock timeout. Events keep
// their order: the messages around a change go in the groups before and
// after it.
// Mutation killed: a change taken into a group like any event (the three
// events commit in one transaction).
func TestChannelChangeIsAGroupOfItsOwn(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "access-alone.example", 6)
	f.grouped(ingest.Options{})
	f.recordTransactions()
	owner, member := f.key(), f.key()
	ch := f.channel(owner, false)
	g := f.holdWriter()

	before := f.sign(owner, ingest.KindChat, "before", nostr.Tags{{"h", ch}}, 0)
	change := f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}}, 0)
	after := f.sign(owner, ingest.KindChat, "after", nostr.Tags{{"h", ch}}, 0)
	var results []chan result
	for i, ev := range []*nostr.Event{before, change, after} {
		results = append(results, f.submitTogether([]*nostr.Event{ev})...)
		waitQueued(t, f.p, i+1)
	}
	g.open(t)
	requireStored(t, results, "behind the gate")
	require.Equal(t, 3, f.transactions(before, change, after), "the change shared a transaction with a message")
}

// A change whose channel row is held (here by the test, as a large
// channel's list fold holds it) gives up its group at once and waits alone,
// so the writer is free for the events queued after it: a message into the
// same channel, submitted to the same pipeline while the change waits, is
// stored while the row is still held. The ordinary groups' lock timeout is
// an hour here, so only the change group's own short one frees the writer.
// Mutation killed: the change group waits as long as any group (the
// message waits behind it until the row is released).
func TestMessageIsNotHeldByAChangeWaitingForTheRowInTheSamePipeline(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "access-row-wait.example", 6)
	f.grouped(ingest.Options{GroupLockTimeout: time.Hour})
	owner, joiner := f.key(), f.key()
	ch := f.channel(owner, false)

	fold, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = fold.Rollback(f.ctx) }()
	_, err = fold.Exec(f.ctx, `SELECT 1 FROM channels WHERE id = $1 FOR NO KEY UPDATE`, ch)
	require.NoError(t, err)

	join := f.submitTogether([]*nostr.Event{f.sign(joiner, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0)})
	require.Eventually(t, func() bool { return f.lockWaiters() > 0 }, 30*time.Second, 5*time.Millisecond, "the join never waited for the row")
	message := f.submitTogether([]*nostr.Event{f.sign(owner, ingest.KindChat, "while the row is held", nostr.Tags{{"h", ch}}, 0)})
	requireStored(t, message, "the message waits behind the change waiting for the channel's row")
	require.Positive(t, f.lockWaiters(), "the join still waits for the row")

	require.NoError(t, fold.Rollback(f.ctx))
	requireStored(t, join, "the join after the row's release")
}

// A burst of changes into one channel whose row is held (as a large
// channel's list fold holds it) waits on one of the pipeline's connections
// between them: the first change waits for the row, the others for their
// turn in the process, holding none. A message into another channel finds
// a connection meanwhile, and once the row comes free the changes commit
// one after another in the order they arrived. Only the first change
// tries its group (and its short lock wait): the others find changes of
// their channel in line and join it at once, so a burst costs the writer
// one short wait, and a change cannot pass those in line when the row
// comes free during its wait.
// Mutations killed: a change running alone without waiting for its turn
// (20 backends wait for the row, each holding a connection of the
// pipeline's pool); a change trying its group whatever waits in line (20
// groups settled nothing).
func TestChangesWaitingForTheirChannelsRowHoldOneConnection(t *testing.T) {
	t.Parallel()
	const changes = 20
	f := newFixture(t, "access-change-line.example", 0)
	f.recordTransactions()
	pool := dbtest.PoolOn(t, f.pool.Config().ConnString(), changes+4)
	var handedOn atomic.Int64
	f.p = ingest.New(pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: time.Minute, GroupWriters: 1})
	f.p.OnChangeAlone = func() { handedOn.Add(1) }
	var settledNothing atomic.Int64
	f.p.OnGroup = func(st ingest.GroupStats) {
		if st.Events == 0 {
			settledNothing.Add(1)
		}
	}
	owner := f.key()
	ch, other := f.channel(owner, false), f.channel(owner, false)
	require.Zero(t, handedOn.Load(), "a change whose row is free is handed on")

	fold, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = fold.Rollback(f.ctx) }()
	_, err = fold.Exec(f.ctx, `SELECT 1 FROM channels WHERE id = $1 FOR NO KEY UPDATE`, ch)
	require.NoError(t, err)

	joins := make([]*nostr.Event, changes)
	var joined []chan result
	for i := range joins {
		joins[i] = f.sign(f.key(), ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0)
		joined = append(joined, f.submitTogether(joins[i:i+1])...)
		require.Eventually(t, func() bool { return handedOn.Load() == int64(i+1) }, 30*time.Second, 2*time.Millisecond,
			"join %d was never handed on to run alone", i)
	}
	require.Eventually(t, func() bool { return f.lockWaiters()+ingest.ChangesWaitingTheirTurn(f.p) == changes },
		30*time.Second, 2*time.Millisecond, "the joins neither wait for the row nor for their turn")
	require.Equal(t, 1, f.lockWaiters(), "joins waiting for the row")
	require.EqualValues(t, 1, pool.Stat().AcquiredConns(), "connections the waiting joins hold")

	requireStored(t, f.submitTogether([]*nostr.Event{f.sign(owner, ingest.KindChat, "elsewhere", nostr.Tags{{"h", other}}, 0)}),
		"a message into another channel waits behind the joins")
	requireUnanswered(t, joined, "while the row is held")

	require.NoError(t, fold.Rollback(f.ctx))
	requireStored(t, joined, "the joins after the row's release")
	require.Equal(t, changes, f.transactions(joins...))
	var order []string
	rows, err := f.pool.Query(f.ctx, `SELECT encode(id, 'hex') FROM test_event_tx WHERE encode(id, 'hex') = ANY($1) ORDER BY tx`, eventIDs(joins))
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		order = append(order, id)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, eventIDs(joins), order, "the joins committed out of their arrival order")
	require.EqualValues(t, changes, handedOn.Load())
	require.EqualValues(t, 1, settledNothing.Load(), "groups that tried a join in vain")
}

// A change whose submitter goes away while it waits in its channel's line
// leaves the line without taking a connection, and the changes behind it
// still get their turns: with grouping off too, where every change takes
// the line.
// Mutation killed: leave removing only the change whose turn it is (the
// turn passes to the change that left, and the one behind it waits for
// ever).
func TestChangeLeavingItsLineMidwayPassesNoTurnToNobody(t *testing.T) {
	t.Parallel()
	for _, groupMax := range []int{0, 1} {
		t.Run(fmt.Sprint("group max ", groupMax), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, fmt.Sprintf("access-line-leave-%d.example", groupMax), 8)
			f.grouped(ingest.Options{GroupMax: groupMax})
			owner := f.key()
			ch := f.channel(owner, false)

			fold, err := f.pool.Begin(f.ctx)
			require.NoError(t, err)
			defer func() { _ = fold.Rollback(f.ctx) }()
			_, err = fold.Exec(f.ctx, `SELECT 1 FROM channels WHERE id = $1 FOR NO KEY UPDATE`, ch)
			require.NoError(t, err)

			submit := func(ctx context.Context) chan result {
				ev := f.sign(f.key(), ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0)
				out := make(chan result, 1)
				go func() {
					o, err := f.p.Submit(ctx, f.tenant, ev.PubKey, ev)
					out <- result{o, err}
				}()
				return out
			}
			first := submit(f.ctx)
			f.waitForLockWaiters(1, "the first join does not wait for the row")
			leaving, leave := context.WithCancel(f.ctx)
			defer leave()
			gone := submit(leaving)
			require.Eventually(t, func() bool { return ingest.ChangesWaitingTheirTurn(f.p) == 1 }, 30*time.Second, 2*time.Millisecond)
			last := submit(f.ctx)
			require.Eventually(t, func() bool { return ingest.ChangesWaitingTheirTurn(f.p) == 2 }, 30*time.Second, 2*time.Millisecond)
			// The first join waited for the row in its group's short try
			// above; now it waits in its own transaction, having the turn.
			f.waitForLockWaiters(1, "the first join does not wait for the row on its turn")

			leave()
			got := <-gone
			require.ErrorIs(t, got.err, context.Canceled)
			require.Equal(t, 1, f.lockWaiters(), "the join that left took a connection")
			require.NoError(t, fold.Rollback(f.ctx))
			requireStored(t, []chan result{first, last}, "the join behind the one that left never got its turn")
		})
	}
}

func eventIDs(events []*nostr.Event) []string {
	ids := make([]string, len(events))
	for i, ev := range events {
		ids[i] = ev.ID
	}
	return ids
}

// An event whose handler locks its channel's row (a workflow save) is a
// group of its own too: in a group holding a message's write lock shared,
// its row wait would close a cycle with a change that holds the row and
// waits for that lock. Mutation killed: LocksChannelRow ignored (the three
// events share one transaction).
func TestEventLockingItsChannelRowIsAGroupOfItsOwn(t *testing.T) {
	t.Parallel()
	const kindLockingTheRow = 30999
	f := newFixture(t, "access-row-alone.example", 6)
	f.grouped(ingest.Options{})
	f.p.Register(kindLockingTheRow, ingest.Handler{LocksChannelRow: true})
	f.recordTransactions()
	owner := f.key()
	ch := f.channel(owner, false)
	g := f.holdWriter()

	before := f.sign(owner, ingest.KindChat, "before", nostr.Tags{{"h", ch}}, 0)
	save := f.sign(owner, kindLockingTheRow, "", nostr.Tags{{"d", "x"}}, 0)
	after := f.sign(owner, ingest.KindChat, "after", nostr.Tags{{"h", ch}}, 0)
	var results []chan result
	for i, ev := range []*nostr.Event{before, save, after} {
		results = append(results, f.submitTogether([]*nostr.Event{ev})...)
		waitQueued(t, f.p, i+1)
	}
	g.open(t)
	requireStored(t, results, "behind the gate")
	require.Equal(t, 3, f.transactions(before, save, after), "the row-locking event shared a transaction with a message")
}

// A change holds its channel's row FOR NO KEY UPDATE, not FOR UPDATE: it
// takes the row and then waits for the writes in flight (their write lock
// shared), and a write in flight may still need the row for a foreign key's
// check (FOR KEY SHARE: a reply's thread row, a member row), which FOR
// UPDATE would refuse it until the change ends: the two would deadlock.
// Mutation killed: ChannelLockForChange FOR UPDATE (deadlock detected).
func TestChangeHoldingTheRowLetsTheWriteItWaitsForCheckItsForeignKeys(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "access-key-share.example", 6)
	f.grouped(ingest.Options{GroupMax: 1})
	owner := f.key()
	ch := f.channel(owner, false)

	inFlight, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = inFlight.Rollback(f.ctx) }()
	_, err = inFlight.Exec(f.ctx, `SET LOCAL lock_timeout = '20s'`)
	require.NoError(t, err)
	_, err = inFlight.Exec(f.ctx, `SELECT pg_advisory_xact_lock_shared(channels_write_lock_key($1, $2))`, f.tenant.ID(), ch)
	require.NoError(t, err)

	change := f.submitTogether([]*nostr.Event{f.sign(owner, ingest.KindEditMetadata, "", nostr.Tags{{"h", ch}, {"name", "renamed"}}, 0)})
	require.Eventually(t, func() bool {
		return f.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'advisory'`) > 0
	}, 30*time.Second, 5*time.Millisecond, "the change never waited for the write in flight")

	_, err = inFlight.Exec(f.ctx, `SELECT 1 FROM channels WHERE community_id = $1 AND id = $2 FOR KEY SHARE`, f.tenant.ID(), ch)
	require.NoError(t, err, "the write in flight checks a foreign key to the channel")
	require.NoError(t, inFlight.Commit(f.ctx))
	requireStored(t, change, "the change after the write in flight")
}

// A change that finds changes of its channel in line joins it at once,
// never waiting in a group, so its wait is observed when it runs: from its
// arrival to its turn, as Waited of its group of one (the relay's
// buzz_ingest_group_wait_seconds). The second join here arrives while the
// first waits for the channel's row and gets its turn only after the row is
// released, so the wait observed for it spans at least the time between
// the test seeing it in line and releasing the row.
// Mutation killed: a change's run alone observed with no wait (every group
// observed waited 0).
func TestJoinedChangesWaitIsObserved(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "access-line-wait.example", 8)
	f.grouped(ingest.Options{})
	var mu sync.Mutex
	var waits []time.Duration
	f.p.OnGroup = func(st ingest.GroupStats) {
		mu.Lock()
		defer mu.Unlock()
		waits = append(waits, st.Waited)
	}
	owner := f.key()
	ch := f.channel(owner, false)

	fold, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = fold.Rollback(f.ctx) }()
	_, err = fold.Exec(f.ctx, `SELECT 1 FROM channels WHERE id = $1 FOR NO KEY UPDATE`, ch)
	require.NoError(t, err)

	first := f.submitTogether([]*nostr.Event{f.sign(f.key(), ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0)})
	f.waitForLockWaiters(1, "the first join does not wait for the row")
	second := f.submitTogether([]*nostr.Event{f.sign(f.key(), ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0)})
	require.Eventually(t, func() bool { return ingest.ChangesWaitingTheirTurn(f.p) == 1 }, 30*time.Second, 2*time.Millisecond,
		"the second join does not wait for its turn")
	seenInLine := time.Now()
	time.Sleep(50 * time.Millisecond) // a span the observed wait must cover
	inLineAtLeast := time.Since(seenInLine)
	require.NoError(t, fold.Rollback(f.ctx))
	requireStored(t, append(first, second...), "the joins after the row's release")

	mu.Lock()
	defer mu.Unlock()
	var coveringTheSpan int
	for _, w := range waits {
		if w >= inLineAtLeast {
			coveringTheSpan++
		}
	}
	require.Positive(t, coveringTheSpan, "no observed wait covers the second join's time in line: %v", waits)
}
