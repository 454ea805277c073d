package outbox

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/querytmpl"
)

// The poll's claim is rendered from its template (the generated file is
// fresh), skips locked rows and takes only rows this pod routes.
func TestClaimQueryIsFreshAndRouteFiltered(t *testing.T) {
	t.Parallel()
	const tmpl = "../../queries/templates/outbox_claim.sql.tmpl"
	rendered, err := os.ReadFile(querytmpl.OutputPath(tmpl))
	require.NoError(t, err)
	fresh, err := querytmpl.Render(tmpl)
	require.NoError(t, err)
	require.Equal(t, string(fresh), string(rendered), "queries/outbox_claim.gen.sql is stale: run make generate")
	require.Equal(t, 1, strings.Count(string(rendered), "-- name: "))
	require.Contains(t, string(rendered), "-- name: OutboxClaimDue :many")
	require.Contains(t, string(rendered), "FOR UPDATE OF o SKIP LOCKED")
	require.Contains(t, string(rendered), "AND o.listener_pubkey = ANY(@routable::bytea[])", "the poll is route-filtered")
}

func TestClaimReturnsTheAttemptStartingAndTheCommunityHost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	listener, target := newPubkey(t), newPubkey(t)
	f.register(listener, target)
	ids := f.enqueue(target)
	c := f.claimer(Routes{listener: "https://l.example"})

	claims, err := c.claimDue(ctx, 10, nil)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	got := claims[0]
	require.Equal(t, ids[0], got.row.ID)
	require.Equal(t, int32(1), got.row.Attempts)
	require.Equal(t, testHost, got.row.Host)
	require.Equal(t, f.community, got.row.CommunityID)

	r, _ := f.row(ids[0])
	require.Equal(t, "sending", r.State)
	require.Equal(t, got.claimID, *r.ClaimID)
	require.WithinDuration(t, time.Now().Add(defaultLease), *r.LeaseUntil, 5*time.Second)

	again, err := c.claimDue(ctx, 10, nil)
	require.NoError(t, err)
	require.Empty(t, again, "a leased row is not due")
}

func TestClaimDeliveriesSkipsRowsPastRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	listener, oldTarget, freshTarget := newPubkey(t), newPubkey(t), newPubkey(t)
	f.register(listener, oldTarget, freshTarget)
	old, fresh := f.enqueue(oldTarget)[0], f.enqueue(freshTarget)[0]
	f.exec(`UPDATE operator_listener_outbox SET created_at = now() - interval '15 minutes 1 second' WHERE id = $1`, old)
	f.exec(`UPDATE operator_listener_outbox SET created_at = now() - interval '14 minutes 50 seconds' WHERE id = $1`, fresh)
	c := f.claimer(Routes{listener: "https://l.example"})

	due, err := c.claimDue(ctx, 10, nil)
	require.NoError(t, err)
	require.Len(t, due, 1)
	require.Equal(t, fresh, due[0].row.ID)
}

// A notification whose target may no longer read its mention, because the
// mention was hidden or is gone, its channel was deleted or the target was
// removed from the private channel while the row waited (for a listener
// that was down), is withdrawn by the poll instead of sent: its row is
// deleted. Mentions the target may still read are claimed as usual. Both
// kinds of due row are checked, pending ones and one whose lease expired.
//
// Mutations killed: the claim without its readable condition (every row is
// claimed and would be POSTed); readable checking only that the event is
// live (the deleted channel's and the removed member's rows are claimed).
func TestClaimWithdrawsMentionsItsTargetMayNoLongerRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	listener := newPubkey(t)
	hiddenTo, goneTo, deletedChannelTo, removedTo, memberTo, everyoneTo := newPubkey(t), newPubkey(t), newPubkey(t), newPubkey(t), newPubkey(t), newPubkey(t)
	f.register(listener, hiddenTo, goneTo, deletedChannelTo, removedTo, memberTo, everyoneTo)
	private := f.channel("private", []string{removedTo, memberTo}, nil)
	doomed := f.channel("open", nil, nil)

	queue := func(target string, channel *uuid.UUID) (*nostr.Event, uuid.UUID) {
		t.Helper()
		ev := message(t, 9, target)
		f.saveIn(ev, channel)
		ids := f.outboxIDs(ev)
		require.Len(t, ids, 1)
		return ev, ids[0]
	}
	hidden, hiddenRow := queue(hiddenTo, nil)
	gone, goneRow := queue(goneTo, nil)
	_, deletedChannelRow := queue(deletedChannelTo, &doomed)
	_, removedRow := queue(removedTo, &private)
	_, memberRow := queue(memberTo, &private)
	_, everyoneRow := queue(everyoneTo, nil)

	hiddenID, goneID := hidden.IDBytes(), gone.IDBytes()
	f.exec(`UPDATE events SET deleted_at = now() WHERE community_id = $1 AND id = $2`, f.community, hiddenID[:])
	// This row's worker died holding it; its event is gone outright.
	f.exec(`UPDATE operator_listener_outbox
	        SET state = 'sending', claim_id = gen_random_uuid(), lease_until = now() - interval '1 second', attempts = 1
	        WHERE id = $1`, goneRow)
	f.exec(`DELETE FROM events WHERE community_id = $1 AND id = $2`, f.community, goneID[:])
	f.exec(`UPDATE channels SET deleted_at = now() WHERE community_id = $1 AND id = $2`, f.community, doomed)
	f.exec(`UPDATE channel_members SET removed_at = now() WHERE community_id = $1 AND channel_id = $2 AND pubkey = $3`,
		f.community, private, mustHex(t, removedTo))

	claims, err := f.claimer(Routes{listener: "https://l.example"}).claimDue(ctx, 10, nil)
	require.NoError(t, err)
	var claimed []uuid.UUID
	for _, c := range claims {
		claimed = append(claimed, c.row.ID)
	}
	require.ElementsMatch(t, []uuid.UUID{memberRow, everyoneRow}, claimed, "only mentions their targets may still read")
	for _, id := range []uuid.UUID{hiddenRow, goneRow, deletedChannelRow, removedRow} {
		_, ok := f.row(id)
		require.False(t, ok, "the withdrawn notification's row is deleted")
	}
}

// A poll whose first pass only withdraws rows is not an idle poll: the
// rows of hidden mentions ahead of a readable one are withdrawn, pass after
// pass, and the readable one is claimed in the same call, so the loop does
// not back off while it is due. Each withdrawn row is counted.
// Mutation killed: claimDue returning after one pass (no claim: the loop
// would back off for up to IdlePoll per ten withdrawn rows).
func TestClaimDrainsWithdrawnRowsAheadOfAReadableOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	listener, hiddenTo, readableTo := newPubkey(t), newPubkey(t), newPubkey(t)
	f.register(listener, hiddenTo, readableTo)
	const hidden = 25
	for range hidden {
		ev := message(t, 9, hiddenTo)
		f.save(ev, nil, true)
		id := ev.IDBytes()
		f.exec(`UPDATE events SET deleted_at = now() WHERE community_id = $1 AND id = $2`, f.community, id[:])
	}
	f.exec(`UPDATE operator_listener_outbox SET next_attempt_at = now() - interval '1 minute'`) // due first
	readable := f.enqueue(readableTo)[0]

	m, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	c := f.claimer(Routes{listener: "https://l.example"})
	c.metrics = m
	claims, err := c.claimDue(ctx, 10, nil)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	require.Equal(t, readable, claims[0].row.ID)
	require.Equal(t, float64(hidden), testutil.ToFloat64(m.deliveries.WithLabelValues(outcomeWithdrawn)))
	require.Equal(t, 1, f.outboxCount(), "only the claimed row is left")
}

func TestClaimSkipsRowsNotDueOrOutOfAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	listener, t1, t2 := newPubkey(t), newPubkey(t), newPubkey(t)
	f.register(listener, t1, t2)
	later, spent := f.enqueue(t1)[0], f.enqueue(t2)[0]
	f.exec(`UPDATE operator_listener_outbox SET next_attempt_at = now() + interval '1 hour' WHERE id = $1`, later)
	f.exec(`UPDATE operator_listener_outbox SET attempts = 9 WHERE id = $1`, spent)
	c := f.claimer(Routes{listener: "https://l.example"})
	claims, err := c.claimDue(ctx, 10, nil)
	require.NoError(t, err)
	require.Empty(t, claims)
}

func TestExpiredClaimIsRecoveredAndOldClaimTokenIsFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	listener, target := newPubkey(t), newPubkey(t)
	f.register(listener, target)
	id := f.enqueue(target)[0]
	claimAt := func(now time.Time) []db.OutboxClaimDueRow {
		rows, err := f.q.OutboxClaimDue(ctx, db.OutboxClaimDueParams{
			ClaimID: uuid.New(), Now: &now, LeaseMs: defaultLease.Milliseconds(), MaxAttempts: maxAttempts,
			RetentionMs: retention.Milliseconds(), Routable: [][]byte{mustHex(t, listener)}, Room: []int32{10}, MaxRows: 10,
		})
		require.NoError(t, err)
		return rows
	}
	now := time.Now()
	require.Len(t, claimAt(now), 1)
	first, _ := f.row(id)
	require.Empty(t, claimAt(now.Add(29*time.Second)), "the lease holds")

	// The first worker stalls past its lease; another claims the row.
	require.Len(t, claimAt(now.Add(31*time.Second)), 1)
	second, _ := f.row(id)
	require.Equal(t, int32(2), second.Attempts)
	require.NotEqual(t, *first.ClaimID, *second.ClaimID)

	// Every transition under the old token is fenced out.
	stale := func(q func() (int64, error)) {
		n, err := q()
		require.NoError(t, err)
		require.Zero(t, n)
	}
	stale(func() (int64, error) {
		return f.q.OutboxComplete(ctx, db.OutboxCompleteParams{ID: id, ClaimID: *first.ClaimID})
	})
	stale(func() (int64, error) {
		return f.q.OutboxRetry(ctx, db.OutboxRetryParams{ID: id, ClaimID: *first.ClaimID, DelayMs: 1000, MaxAttempts: maxAttempts})
	})
	stale(func() (int64, error) {
		return f.q.OutboxRelease(ctx, db.OutboxReleaseParams{ID: id, ClaimID: *first.ClaimID, DelayMs: 1000})
	})
	unchanged, ok := f.row(id)
	require.True(t, ok)
	require.Equal(t, second.ClaimID, unchanged.ClaimID)
	require.Equal(t, "sending", unchanged.State)

	n, err := f.q.OutboxComplete(ctx, db.OutboxCompleteParams{ID: id, ClaimID: *second.ClaimID})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	_, ok = f.row(id)
	require.False(t, ok)
}

// 4 pollers race over 200 pending rows while 4 saving pods insert 200
// more mentions, each making one row claimed at insert (for the listener the
// savers route) and one pending row (for a listener only the pollers
// route), and a fifth claimant holds some rows in an open transaction.
// Every row is claimed exactly once with attempts = 1, and no claimant ever
// waits for another's locks.
//
// Kills: removing SKIP LOCKED from the claim template (checked: with plain
// FOR UPDATE OF o the racers queue behind the held rows and hit the 2 s
// lock_timeout). Kills: rows claimed at insert without a live lease
// (checked with lease_until = now - lease in OutboxEnqueueMentions): the
// pollers claim them a second time.
func TestClaimRaceClaimsEveryRowExactlyOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dbtest.URL(t))
	require.NoError(t, err)
	cfg.MaxConns = 12
	// A claim never waits for a lock: waiting is a failure here.
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = "2s"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	f := fixtureOn(t, pool)

	// The savers route saved; the pollers route saved and polled.
	saved, polled := newPubkey(t), newPubkey(t)
	claims := f.claimer(Routes{saved: "https://saved.example", polled: "https://polled.example"})

	for round := range 5 {
		f.exec(`DELETE FROM operator_listener_outbox`)
		f.exec(`DELETE FROM operator_listener_pubkeys`)
		targets := make([]string, 200)
		for i := range targets {
			targets[i] = newPubkey(t)
		}
		f.register(polled, targets...)
		ids := f.enqueue(targets...)
		require.Len(t, ids, 200)
		mentioned := make([]string, 200) // each saved message mentions one, registered by both listeners
		for i := range mentioned {
			mentioned[i] = newPubkey(t)
		}
		f.register(saved, mentioned...)
		f.register(polled, mentioned...)

		// The holder claims 10 rows and keeps its transaction open through
		// the race: the racers must get past those locks without waiting.
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		held, err := pgClaimer{q: db.New(tx), routable: Routes{polled: ""}.pubkeys(), lease: defaultLease}.claimDue(ctx, 10, nil)
		require.NoError(t, err)
		require.Len(t, held, 10)

		var mu sync.Mutex
		claimedBy := map[uuid.UUID]int{}
		record := func(cs []claim) {
			mu.Lock()
			defer mu.Unlock()
			for _, c := range cs {
				claimedBy[c.row.ID]++
				if c.row.Attempts != 1 {
					t.Errorf("row %s claimed at attempt %d", c.row.ID, c.row.Attempts)
				}
			}
		}
		var savers, pollers sync.WaitGroup
		var saving atomic.Bool
		saving.Store(true)
		for s := range 4 {
			savers.Go(func() {
				w := f.idleWorker(Routes{saved: "https://saved.example"})
				for _, tg := range mentioned[s*50 : (s+1)*50] {
					f.save(message(t, 9, tg), w, true)
					record(handedOff(w))
				}
			})
			pollers.Go(func() {
				for {
					stillSaving := saving.Load()
					cs, err := claims.claimDue(ctx, 10, nil)
					if !assertNoError(t, err) {
						return
					}
					if len(cs) == 0 && !stillSaving {
						return
					}
					record(cs)
				}
			})
		}
		savers.Wait()
		saving.Store(false)
		pollers.Wait()
		require.NoError(t, tx.Commit(ctx))
		record(held)

		require.Equal(t, 600, len(claimedBy), "round %d: every row claimed", round)
		for id, n := range claimedBy {
			require.Equal(t, 1, n, "round %d: row %s claimed %d times", round, id, n)
		}
		var sending, attemptsOne, savedRows int
		require.NoError(t, pool.QueryRow(ctx, `
			SELECT count(*) FILTER (WHERE state = 'sending'), count(*) FILTER (WHERE attempts = 1),
			       count(*) FILTER (WHERE listener_pubkey = $1)
			FROM operator_listener_outbox`, mustHex(t, saved)).Scan(&sending, &attemptsOne, &savedRows))
		require.Equal(t, 600, sending)
		require.Equal(t, 600, attemptsOne)
		require.Equal(t, 200, savedRows)
	}
}

func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Errorf("claim: %v", err)
		return false
	}
	return true
}

func TestRepeatedRegistrationRenewsCreatedAt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	listener, target := mustHex(t, newPubkey(t)), mustHex(t, newPubkey(t))
	register := func(at time.Time) {
		_, err := f.q.ListenerRegistrationsUpsert(ctx, db.ListenerRegistrationsUpsertParams{
			Listener: listener, Targets: [][]byte{target, target}, Now: &at,
		})
		require.NoError(t, err)
	}
	first := time.Now().Add(-20 * 24 * time.Hour).Truncate(time.Microsecond)
	register(first)
	register(first.Add(10 * 24 * time.Hour))
	rows, err := f.q.ListenerRegistrationsList(ctx, listener)
	require.NoError(t, err)
	require.Len(t, rows, 1, "duplicates in one call and across calls are one registration")
	require.True(t, first.Add(10*24*time.Hour).Equal(rows[0].CreatedAt))
}

// Both claims commit without waiting for the WAL flush: the setting they
// leave in their transaction is what the commit reads. Run inside a
// transaction that asked for durable commits, each claim must have turned
// them off by the time the transaction ends.
func TestClaimsCommitWithoutWaitingForTheFlush(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	listener, target := newPubkey(t), newPubkey(t)
	f.register(listener, target)
	routable := [][]byte{mustHex(t, listener)}

	claims := map[string]func(q *db.Queries, ids []uuid.UUID) (int, error){
		"due": func(q *db.Queries, _ []uuid.UUID) (int, error) {
			rows, err := q.OutboxClaimDue(ctx, db.OutboxClaimDueParams{
				ClaimID: uuid.New(), LeaseMs: 30_000, MaxAttempts: maxAttempts, RetentionMs: retention.Milliseconds(),
				Routable: routable, Room: []int32{10}, MaxRows: 10,
			})
			return len(rows), err
		},
	}
	for name, claim := range claims {
		t.Run(name, func(t *testing.T) {
			ids := f.enqueue(target)
			tx, err := f.pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			_, err = tx.Exec(ctx, "SET LOCAL synchronous_commit = on")
			require.NoError(t, err)
			n, err := claim(db.New(tx), ids)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			var setting string
			require.NoError(t, tx.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&setting))
			require.Equal(t, "off", setting, "the claim commits waiting for the flush")
			require.NoError(t, tx.Commit(ctx))
		})
	}
}

// The poll reads about as many rows as it claims, however large the due
// backlog (a listener back after an outage, a burst of mentions), and
// however it is spread over communities: it must not read and sort the
// whole backlog on every tick. It still takes the oldest due rows of each
// community first, expired leases among them, and serves each community
// with due rows. Rows read are counted by PostgreSQL for the claim's own
// transaction (pg_stat_xact_user_tables).
//
// Mutations killed: the candidates as one scan with "pending OR expired"
// (the claim before 009's two scans): it reads all 40,000 due rows; the
// pending rows as one scan in due order across communities (the claim
// before 037): community C's row, due last, is not claimed.
func TestClaimReadsItsRowsNotTheBacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	fb, fc := f.otherCommunity("b.example"), f.otherCommunity("c.example")
	listener := mustHex(t, newPubkey(t))
	const backlog = 20000
	// In each community one stored message mentioning every target: the
	// claim reads each claimed row's event. A and B hold 20,000 rows each,
	// C one row due after all of them.
	backlogIn := func(f *fixture, rows int, dueFrom string) {
		t.Helper()
		mention := message(t, 9)
		f.save(mention, nil, true)
		f.exec(`INSERT INTO operator_listener_outbox
		            (listener_pubkey, target_pubkey, community_id, event_id, event_kind, event_created_at, next_attempt_at)
		        SELECT $1, decode(md5('t' || i) || md5('u' || i), 'hex'), $2, $4,
		               9, to_timestamp($5), now() - $6::interval + i * interval '1 millisecond'
		        FROM generate_series(1, $3::int) AS i`,
			listener, f.community, rows, mustHex(t, mention.ID), mention.CreatedAt, dueFrom)
	}
	backlogIn(f, backlog, "1 minute")
	backlogIn(fb, backlog, "1 minute")
	backlogIn(fc, 1, "1 second")
	// Three rows of A whose worker died holding them, due before any
	// pending row.
	f.exec(`UPDATE operator_listener_outbox
	        SET state = 'sending', claim_id = gen_random_uuid(), lease_until = now() - interval '1 second',
	            attempts = 1, next_attempt_at = now() - interval '2 minutes'
	        WHERE id IN (SELECT id FROM operator_listener_outbox WHERE community_id = $1
	                     ORDER BY next_attempt_at DESC LIMIT 3)`, f.community)
	f.exec(`ANALYZE operator_listener_outbox`)

	tx, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	before := dbtest.RowsRead(t, tx, "operator_listener_outbox")
	claimed, err := db.New(tx).OutboxClaimDue(ctx, db.OutboxClaimDueParams{
		ClaimID: uuid.New(), LeaseMs: defaultLease.Milliseconds(), MaxAttempts: maxAttempts,
		RetentionMs: retention.Milliseconds(), Routable: [][]byte{listener}, Room: []int32{10}, MaxRows: 10,
	})
	require.NoError(t, err)
	require.Len(t, claimed, 10)
	recovered := 0
	per := map[uuid.UUID]int{}
	for _, r := range claimed {
		if r.Attempts == 2 {
			recovered++
		}
		per[r.CommunityID]++
	}
	require.Equal(t, 3, recovered, "the expired leases are A's oldest due rows")
	// Rows are taken a level at a time (a row of each community, then the
	// next of each): A 4 (among them the 3 expired), B 4 and C's one, plus
	// A's fifth of 7 locked (the 3 expired and its 4 of the room of 10
	// shared by 3 communities).
	require.Equal(t, map[uuid.UUID]int{f.community: 5, fb.community: 4, fc.community: 1}, per)

	read := dbtest.RowsRead(t, tx, "operator_listener_outbox") - before
	require.Less(t, read, int64(100), "rows the claim read, of a %d-row backlog", 2*backlog+1)
}

// A listener's slots are shared by the communities its due rows come from,
// whatever came first: a poll takes a row of each community with due rows
// before a second of any, and a community with fewer of this pod's
// deliveries in flight before one with more.
//
// Mutation killed: the pending rows as one scan in due order across
// communities (the claim before 037): every row claimed is the flood's.
func TestClaimTakesTurnsBetweenCommunities(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fa := newFixture(t)
	fb, fc := fa.otherCommunity("b.example"), fa.otherCommunity("c.example")
	listener := newPubkey(t)
	targets := make([]string, 30)
	for i := range targets {
		targets[i] = newPubkey(t)
	}
	fa.register(listener, targets...)
	fa.enqueue(targets...) // the flood, due first
	fa.exec(`UPDATE operator_listener_outbox SET next_attempt_at = now() - interval '1 minute'`)
	fb.enqueue(targets[:3]...)
	fc.enqueue(targets[0])
	c := fa.claimer(Routes{listener: "https://l.example"})
	communities := func(claims []claim) map[uuid.UUID]int {
		per := map[uuid.UUID]int{}
		for _, cl := range claims {
			per[cl.row.CommunityID]++
		}
		return per
	}

	claims, err := c.claimDue(ctx, 3, nil)
	require.NoError(t, err)
	require.Equal(t, map[uuid.UUID]int{fa.community: 1, fb.community: 1, fc.community: 1}, communities(claims),
		"a row of each community first")

	// The flood holds 8 of the listener's 10 slots, B one: the free slot
	// goes to B, which holds fewer, though the flood's rows are due first.
	key := string(mustHex(t, listener))
	busy := inFlightOf(map[slotKey]int{{key, fa.community}: 8, {key, fb.community}: 1})
	claims, err = c.claimDue(ctx, 10, busy)
	require.NoError(t, err)
	require.Equal(t, map[uuid.UUID]int{fb.community: 1}, communities(claims))
}

// The poll takes no more of a listener's rows than the slots it has left
// (its share less its deliveries in flight), and none of a listener that
// has its share in flight, whatever its backlog; the others' rows are
// claimed as usual. Mutation killed: the claim without its per-listener
// room (c.nth <= room dropped: 5 rows of the busy listener).
func TestClaimTakesNoMoreOfAListenerThanItsRoom(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	busy, idle := newPubkey(t), newPubkey(t)
	busyTargets, idleTargets := make([]string, 5), make([]string, 5)
	for i := range 5 {
		busyTargets[i], idleTargets[i] = newPubkey(t), newPubkey(t)
	}
	f.register(busy, busyTargets...)
	f.register(idle, idleTargets...)
	f.enqueue(busyTargets...)
	f.enqueue(idleTargets...)
	c := f.claimer(Routes{busy: "https://busy.example", idle: "https://idle.example"})
	require.Equal(t, 5, listenerCap(2))

	claims, err := c.claimDue(ctx, 10, inFlightOf(map[slotKey]int{{string(mustHex(t, busy)), f.community}: 3}))
	require.NoError(t, err)
	per := map[string]int{}
	for _, cl := range claims {
		per[hex.EncodeToString(cl.row.ListenerPubkey)]++
	}
	require.Equal(t, map[string]int{busy: 2, idle: 5}, per)

	claims, err = c.claimDue(ctx, 10, inFlightOf(map[slotKey]int{
		{string(mustHex(t, busy)), f.community}: 5, {string(mustHex(t, idle)), f.community}: 5,
	}))
	require.NoError(t, err)
	require.Empty(t, claims, "both listeners have their share in flight")
	claims, err = c.claimDue(ctx, 10, nil)
	require.NoError(t, err)
	require.Len(t, claims, 3, "the busy listener's rows passed over stayed due")
}

// inFlightOf counts n deliveries in flight for each key of n.
func inFlightOf(n map[slotKey]int) *inFlight {
	b := newInFlight()
	for k, c := range n {
		for range c {
			b.add(k)
		}
	}
	return b
}

// A community whose earliest due rows are past the retention (left for the
// reaper) or out of attempts has no row the claim may take: it does not
// take a place of the listener's room from a community that has one. Here
// the listener has one free slot; community A holds only a row past the
// retention, due before B's row.
//
// Mutation killed: due_communities without its check that a community has
// a row to take (nothing is claimed while A's row waits for the reaper, up
// to 5 minutes).
func TestClaimPassesOverACommunityHoldingOnlyRowsItMayNotTake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fa := newFixture(t)
	fb, fc := fa.otherCommunity("b.example"), fa.otherCommunity("c.example")
	listener, target := newPubkey(t), newPubkey(t)
	fa.register(listener, target)
	old := fa.enqueue(target)[0]
	fa.exec(`UPDATE operator_listener_outbox SET created_at = now() - interval '16 minutes',
	                next_attempt_at = now() - interval '1 minute' WHERE id = $1`, old)
	spent := fa.enqueue(target)[0]
	fa.exec(`UPDATE operator_listener_outbox SET attempts = 9, next_attempt_at = now() - interval '50 seconds'
	         WHERE id = $1`, spent)
	taken := fb.enqueue(target)[0]
	c := fa.claimer(Routes{listener: "https://l.example"})
	busy := inFlightOf(map[slotKey]int{{string(mustHex(t, listener)), fc.community}: 9})

	claims, err := c.claimDue(ctx, 10, busy)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{taken}, idsOf(claims))
}

// Across polls the communities with due rows take turns: each poll walks
// on from where the last one stopped, so with more communities than room
// every community gets a row before any gets a second, even when one
// community's rows were all due before another's. Here 30 communities hold
// 3 due rows each (community 0's all due first, then community 1's ...),
// and each poll has a room of 10.
//
// Mutations killed: the walk always starting at the first community (the
// cursor not advanced, or not passed to the claim): the second poll takes
// the first poll's communities again.
func TestClaimCommunitiesTakeTurnsAcrossPolls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	listener := newPubkey(t)
	targets := []string{newPubkey(t), newPubkey(t), newPubkey(t)}
	f.register(listener, targets...)
	communities := map[uuid.UUID]bool{}
	for i := range 30 {
		c := f.otherCommunity(fmt.Sprintf("turn-%d.example", i))
		c.enqueue(targets...)
		f.exec(`UPDATE operator_listener_outbox
		        SET next_attempt_at = now() - interval '1 minute' + $2 * interval '1 millisecond'
		        WHERE community_id = $1`, c.community, i)
		communities[c.community] = true
	}
	c := f.claimer(Routes{listener: "https://l.example"})

	served := map[uuid.UUID]int{}
	for poll := range 4 {
		claims, err := c.claimDue(ctx, 10, nil)
		require.NoError(t, err)
		require.Len(t, claims, 10)
		for _, cl := range claims {
			served[cl.row.CommunityID]++
		}
		for community := range communities {
			require.Contains(t, []int{poll / 3, poll/3 + 1}, served[community],
				"after poll %d: every community gets a row before any gets a second", poll)
		}
	}
	require.Len(t, served, 30)
}

// Rows whose lease expired are taken again in turn, and the walk goes on
// from where it stopped: the communities a poll walked past but had no room
// for (the recovered rows took it) are served next, before any community
// gets a second row. Here 30 communities hold 3 due rows each and each
// poll has a room of 10; 3 rows the first poll claimed (of the 10
// communities first in the walk, due first) are left to expire, and the
// other 20 communities' rows are due in the reverse of the walk's order.
//
// Mutations killed: the walked rows taken by due time rather than walk
// order (the claim before this test: the second poll took the 7 walked
// communities due first, the last 7 the walk reached, and the cursor passed
// the 3 it had no room for: "every community gets a row before any gets a
// second" after the fourth poll); the cursor moved by recovered rows too
// (walkCursor.advance not skipping them: the walk restarts after their
// community, which gets a second row at once).
func TestClaimTakesExpiredLeasesInTurnAndWalksOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	listener := newPubkey(t)
	targets := []string{newPubkey(t), newPubkey(t), newPubkey(t)}
	f.register(listener, targets...)
	var walk []uuid.UUID
	for i := range 30 {
		c := f.otherCommunity(fmt.Sprintf("expired-%d.example", i))
		c.enqueue(targets...)
		walk = append(walk, c.community)
	}
	slices.SortFunc(walk, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	for i, community := range walk {
		due := time.Duration(i)*time.Millisecond - 2*time.Minute // the first poll's: due first
		if i >= 10 {
			due = -time.Minute - time.Duration(i)*time.Millisecond // the rest in reverse walk order
		}
		f.exec(`UPDATE operator_listener_outbox SET next_attempt_at = now() + $2 * interval '1 millisecond'
		        WHERE community_id = $1`, community, due.Milliseconds())
	}
	c := f.claimer(Routes{listener: "https://l.example"})
	poll := func() []claim {
		t.Helper()
		claims, err := c.claimDue(ctx, 10, nil)
		require.NoError(t, err)
		require.Len(t, claims, 10)
		return claims
	}
	first := poll()
	var expired []uuid.UUID
	for _, cl := range first[:3] {
		expired = append(expired, cl.row.ID)
	}
	f.exec(`UPDATE operator_listener_outbox SET lease_until = now() - interval '1 second' WHERE id = ANY($1)`, expired)

	served := map[uuid.UUID]map[uuid.UUID]bool{} // distinct rows by community
	for _, cl := range first {
		served[cl.row.CommunityID] = map[uuid.UUID]bool{cl.row.ID: true}
	}
	second := poll()
	require.Subset(t, idsOf(second), expired, "the expired leases are taken again at once")
	for p := range 3 {
		claims := second
		if p > 0 {
			claims = poll()
		}
		for _, cl := range claims {
			if served[cl.row.CommunityID] == nil {
				served[cl.row.CommunityID] = map[uuid.UUID]bool{}
			}
			served[cl.row.CommunityID][cl.row.ID] = true
		}
		most, least := 0, 3
		for _, community := range walk {
			most, least = max(most, len(served[community])), min(least, len(served[community]))
		}
		require.LessOrEqual(t, most-least, 1,
			"after poll %d: every community gets a row before any gets a second", p+2)
	}
}
