package outbox

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
)

// answersAtOnce is the request timeout for a listener that answers at
// once: long enough that a loaded machine's slow TLS handshake under the
// race detector cannot turn the answer a test checks into a timeout (a
// retry), and short enough that a claim taken up to 20 s before the
// request still passes the lease check (30 s lease: the request must be
// able to end before it).
const answersAtOnce = 10 * time.Second

// claimAndDeliver saves a mention of a fresh target registered by l, its
// row claimed at insert for a worker routing l, optionally pretends
// attempts were already spent, and runs one delivery through d.
func (f *fixture) claimAndDeliver(d *Deliverer, l *testListener, spent int32) (uuid.UUID, claim) {
	f.t.Helper()
	c := f.claimedMention(l)
	c.row.Attempts = spent + 1
	f.exec(`UPDATE operator_listener_outbox SET attempts = $2 WHERE id = $1`, c.row.ID, c.row.Attempts)
	d.deliver(context.Background(), c)
	return c.row.ID, c
}

func outcomes(m *Metrics) map[string]float64 {
	out := map[string]float64{}
	for _, o := range []string{outcomeAccepted, outcomeRetry, outcomeFailed, outcomeUnroutable, outcomeStale} {
		out[o] = testutil.ToFloat64(m.deliveries.WithLabelValues(o))
	}
	return out
}

func TestSuccessfulDeliveryPostsSignedPayloadAndCompletesOutbox(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := newListener(t, nil)
	d, m, _ := f.deliverer(routesOf(l), 5*time.Second, testCAs(l))
	target := newPubkey(t)
	f.register(l.pubHex, target)
	ev := message(t, 40002, target)
	f.save(ev, nil, true)
	id := f.outboxIDs(ev)[0]
	claims, err := f.claimer(routesOf(l)).claimDue(context.Background(), 10, nil)
	require.NoError(t, err)
	d.deliver(context.Background(), claims[0])

	got := l.requests()
	require.Len(t, got, 1)
	require.Equal(t, "/hooks/buzz", got[0].URL)
	require.Equal(t, "application/json", got[0].Header.Get("Content-Type"))
	require.Equal(t, fmt.Sprintf(
		`{"v":1,"pubkey":"%s","community_host":"%s","event_id":"%s","event_kind":40002,"event_created_at":%d}`,
		target, testHost, ev.ID, ev.CreatedAt), string(got[0].Body), "every field, in wire order")

	auth := got[0].Header.Get("Authorization")
	require.True(t, strings.HasPrefix(auth, "Nostr "))
	req := &http.Request{Method: http.MethodPost, Header: http.Header{"Authorization": {auth}}}
	authEv, err := verifyNIP98(req, got[0].Body, l.url)
	require.NoError(t, err, "the listener verifies the header against its URL, POST, the time and the raw body")
	require.Equal(t, d.key.PublicKeyHex(), authEv.PubKey, "signed with the relay key")
	nonce := authEv.Tags.First("nonce")
	require.NotNil(t, nonce)
	_, err = uuid.Parse(nonce[1])
	require.NoError(t, err)

	_, ok := f.row(id)
	require.False(t, ok, "a delivered row is deleted")
	require.Equal(t, map[string]float64{"accepted": 1, "retry": 0, "failed": 0, "unroutable": 0, "stale": 0}, outcomes(m))
}

// hangUp closes the connection without an HTTP response, resetting it.
func hangUp(w http.ResponseWriter, _ *http.Request) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	if tcp, ok := conn.(interface{ NetConn() net.Conn }); ok {
		if c, ok := tcp.NetConn().(*net.TCPConn); ok {
			_ = c.SetLinger(0)
		}
	}
	conn.Close()
}

func TestTransientResponsesRetryWithPersistedDelay(t *testing.T) {
	t.Parallel()
	status := func(code int) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(code) }
	}
	for name, handle := range map[string]http.HandlerFunc{
		"429":              status(http.StatusTooManyRequests),
		"503":              status(http.StatusServiceUnavailable),
		"500":              status(http.StatusInternalServerError),
		"408":              status(http.StatusRequestTimeout),
		"connection reset": hangUp,
		"timeout": func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
			// Returning would answer 200: when the client gives up, its TLS
			// close_notify cancels r.Context() here, and the client can
			// still read that late answer as a success. Never answer.
			panic(http.ErrAbortHandler)
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			l := newListener(t, handle)
			// The "timeout" listener never answers; the others answer at
			// once.
			timeout := answersAtOnce
			if name == "timeout" {
				timeout = 2 * time.Second // the listener never answers: the test waits this out
			}
			d, m, _ := f.deliverer(routesOf(l), timeout, testCAs(l))
			before := time.Now()
			id, _ := f.claimAndDeliver(d, l, 2) // this is attempt 3

			r, ok := f.row(id)
			require.True(t, ok)
			require.Equal(t, "pending", r.State)
			require.Equal(t, int32(3), r.Attempts)
			require.Nil(t, r.ClaimID)
			require.Nil(t, r.LeaseUntil)
			requireDueIn(t, 4*time.Second, r, before, "attempt 3 waits 2^2 s")
			require.Equal(t, 1.0, outcomes(m)["retry"])
			require.Len(t, l.requests(), 1)
		})
	}
}

// A listener that asks for a longer wait (Retry-After, seconds or an HTTP
// date) gets it, up to the longest backoff; a shorter one than the
// attempt's backoff changes nothing. Mutation killed: Retry-After ignored
// (the row is due again in 1 s).
func TestListenerRetryAfterIsHonouredUpToTheLongestBackoff(t *testing.T) {
	t.Parallel()
	// The date is made when the listener answers, so the test's own
	// scheduling is not counted against it.
	date := func(d time.Duration) func() string {
		return func() string { return time.Now().Add(d).UTC().Format(http.TimeFormat) }
	}
	fixed := func(v string) func() string { return func() string { return v } }
	for name, c := range map[string]struct {
		header func() string
		want   time.Duration
	}{
		"seconds":          {fixed("60"), 60 * time.Second},
		"past the longest": {fixed("3600"), maxRetryAfter},
		"date":             {date(90 * time.Second), 90 * time.Second},
		"zero":             {fixed("0"), time.Second},
		"malformed":        {fixed("soon"), time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			l := newListener(t, func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Retry-After", c.header())
				w.WriteHeader(http.StatusTooManyRequests)
			})
			d, _, _ := f.deliverer(routesOf(l), answersAtOnce, testCAs(l))
			before := time.Now()
			id, _ := f.claimAndDeliver(d, l, 0) // attempt 1: a 1 s backoff
			r, ok := f.row(id)
			require.True(t, ok)
			// An HTTP date has whole seconds: up to one less.
			require.LessOrEqual(t, r.DueIn, c.want+50*time.Millisecond)
			require.GreaterOrEqual(t, r.DueIn, c.want-time.Since(before)-time.Second-50*time.Millisecond)
		})
	}
}

func TestRetryDelayDoublesAndCaps(t *testing.T) {
	t.Parallel()
	want := []time.Duration{1, 1, 2, 4, 8, 16, 32, 64, 128, 128}
	for attempt, w := range want {
		require.Equal(t, w*time.Second, retryDelay(int32(attempt)), "attempt %d", attempt)
	}
}

func TestClientErrorFailsAndRemovesOutboxRow(t *testing.T) {
	t.Parallel()
	for _, code := range []int{400, 401, 404, 410} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			l := newListener(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(code) })
			d, m, _ := f.deliverer(routesOf(l), answersAtOnce, testCAs(l))
			id, _ := f.claimAndDeliver(d, l, 0)
			_, ok := f.row(id)
			require.False(t, ok, "terminal: the row is deleted, never retried")
			require.Equal(t, map[string]float64{"accepted": 0, "retry": 0, "failed": 1, "unroutable": 0, "stale": 0}, outcomes(m))
			require.Len(t, l.requests(), 1)
		})
	}
}

func TestRedirectIsTerminalAndTargetIsNotContacted(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var targetHits atomic.Int32
	target := newListener(t, func(http.ResponseWriter, *http.Request) { targetHits.Add(1) })
	l := newListener(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.url, http.StatusFound)
	})
	d, m, _ := f.deliverer(routesOf(l), answersAtOnce, testCAs(l))
	id, _ := f.claimAndDeliver(d, l, 0)

	_, ok := f.row(id)
	require.False(t, ok)
	require.Len(t, l.requests(), 1)
	require.Zero(t, targetHits.Load(), "the redirect target is never contacted")
	require.Equal(t, 1.0, outcomes(m)["failed"])
}

func TestExhaustedAttemptIsTerminal(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := newListener(t, hangUp)
	d, m, logs := f.deliverer(routesOf(l), answersAtOnce, testCAs(l))
	id, c := f.claimAndDeliver(d, l, 8)
	require.Equal(t, int32(9), c.row.Attempts)
	_, ok := f.row(id)
	require.False(t, ok, "attempt 9 is the last")
	require.Equal(t, map[string]float64{"accepted": 0, "retry": 0, "failed": 1, "unroutable": 0, "stale": 0}, outcomes(m))
	require.Contains(t, logs.String(), "retries exhausted")
}

func TestUnroutableDeliveryReleasesClaimWithoutHTTP(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := newListener(t, nil)
	// The claim routes l (another pod's view); this deliverer does not.
	d, m, _ := f.deliverer(Routes{}, 2*time.Second, testCAs(l))
	before := time.Now()
	id, _ := f.claimAndDeliver(d, l, 0)

	r, ok := f.row(id)
	require.True(t, ok)
	require.Equal(t, "pending", r.State)
	require.Zero(t, r.Attempts, "a release does not spend an attempt")
	require.Nil(t, r.ClaimID)
	require.Nil(t, r.LeaseUntil)
	requireDueIn(t, 30*time.Second, r, before, "a release waits 30 s")
	require.Empty(t, l.requests())
	require.Equal(t, map[string]float64{"accepted": 0, "retry": 0, "failed": 0, "unroutable": 1, "stale": 0}, outcomes(m))
}

func TestLostClaimChangesNothingAndIsLogged(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := newListener(t, nil)
	d, _, logs := f.deliverer(routesOf(l), answersAtOnce, testCAs(l))
	held := f.claimedMention(l)
	id := held.row.ID
	stale := claim{claimID: uuid.New(), row: held.row, leaseEnds: held.leaseEnds}

	d.deliver(context.Background(), stale)
	require.Len(t, l.requests(), 1)
	r, ok := f.row(id)
	require.True(t, ok, "the completion under a foreign claim deleted nothing")
	require.Equal(t, held.claimID, *r.ClaimID)
	require.Contains(t, logs.String(), "completion lost its claim")
	require.Contains(t, logs.String(), stale.claimID.String())
}

// A claim whose lease would end before its request could (a hand-off that
// waited too long for a slot) is not POSTed, since past the lease another
// pod's poll may claim and POST the row too: it goes back to the poll, due
// at once, its attempt not spent, counted as stale; the poll's fresh claim
// then delivers it. Mutations killed: no lease check before the POST (the
// listener gets it under the old claim); a check that ignores the request
// timeout (this lease has not ended yet, but would during the request).
func TestClaimWhoseLeaseEndsBeforeItsRequestCouldIsReleasedUnsent(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := newListener(t, nil)
	d, m, _ := f.deliverer(routesOf(l), 2*time.Second, testCAs(l))
	c := f.claimedMention(l)
	c.leaseEnds = time.Now().Add(time.Second)

	before := time.Now()
	d.deliver(context.Background(), c)
	require.Zero(t, len(l.requests()), "POSTed under a lease that could end mid-request")
	r, ok := f.row(c.row.ID)
	require.True(t, ok)
	require.Equal(t, "pending", r.State)
	require.Zero(t, r.Attempts, "the release does not spend an attempt")
	require.Nil(t, r.ClaimID)
	requireDueIn(t, 0, r, before, "due again at once")
	require.Equal(t, map[string]float64{"accepted": 0, "retry": 0, "failed": 0, "unroutable": 0, "stale": 1}, outcomes(m))

	claims, err := f.claimer(routesOf(l)).claimDue(context.Background(), 10, nil)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	d.deliver(context.Background(), claims[0])
	require.Len(t, l.requests(), 1)
	require.Equal(t, 1.0, outcomes(m)[outcomeAccepted])
	require.Zero(t, f.outboxCount())
}

// A completion that never returns (here a row lock nobody releases, as a
// stopped backend or a silent connection would hold it) gives up after its
// bound, leaving the row leased under its claim for the poll to take again
// once the lease expires: the delivery ends and frees its worker slot.
// Before, the delivery waited forever (deliveries run under a context never
// cancelled), and ten of them stopped the pod's worker.
// Mutation killed: Deliverer.transition returning ctx without the timeout
// (deliver never returns while the lock is held).
func TestCompletionStuckOnTheDatabaseGivesUpAndLeavesTheRowLeased(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	l := newListener(t, nil)
	d, m, logs := f.deliverer(routesOf(l), 2*time.Second, testCAs(l))
	d.transitionTimeout = 200 * time.Millisecond
	c := f.claimedMention(l)

	locker, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = locker.Rollback(ctx) })
	_, err = locker.Exec(ctx, `SELECT 1 FROM operator_listener_outbox WHERE id = $1 FOR UPDATE`, c.row.ID)
	require.NoError(t, err)

	done := make(chan struct{})
	go func() {
		defer close(done)
		d.deliver(ctx, c)
	}()
	wait(t, done, 20*time.Second, "the delivery whose completion is stuck to end")
	require.Len(t, l.requests(), 1, "the listener was told")
	require.Contains(t, logs.String(), "operator-listener outbox transition failed")
	require.Equal(t, 1.0, outcomes(m)["accepted"])
	// The relay gave up at once; the server ends the statement when pgx's
	// cancel request reaches it, which a loaded machine can delay past the
	// lock's release: the completion would then apply after all (harmless,
	// but not what this test watches). Release the lock once nothing waits.
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting))
		return waiting == 0
	}, 20*time.Second, 10*time.Millisecond, "the given-up completion still waits on the row")
	require.NoError(t, locker.Rollback(ctx))

	r, ok := f.row(c.row.ID)
	require.True(t, ok, "the completion did not apply: the row stays")
	require.Equal(t, "sending", r.State, "left leased: the poll takes it once the lease expires")
	require.NotNil(t, r.ClaimID)
	require.Equal(t, c.claimID, *r.ClaimID)
}

// A listener answering with huge headers is not read whole: its answer
// fails like a network error (retried), instead of each delivery in flight
// holding up to the transport's 10 MB default. Mutation killed: no
// MaxResponseHeaderBytes on the deliverer's transport (the 1 MiB header is
// read and the delivery accepted).
func TestListenerResponseHeadersAreBounded(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := newListener(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Padding", strings.Repeat("a", 1<<20))
		w.WriteHeader(http.StatusOK)
	})
	d, m, _ := f.deliverer(routesOf(l), 5*time.Second, testCAs(l))
	id, _ := f.claimAndDeliver(d, l, 0)
	r, ok := f.row(id)
	require.True(t, ok)
	require.Equal(t, "pending", r.State, "retried")
	require.Equal(t, map[string]float64{"accepted": 0, "retry": 1, "failed": 0, "unroutable": 0, "stale": 0}, outcomes(m))
}

// A handed-off row's request is signed as Enqueue claims it, before the
// event's transaction commits, so no signature sits between the commit and
// the POST; a header older than signedFreshFor when its POST goes out (a
// hand-off that waited for a slot) is signed again. Mutations killed:
// deliver signing every request as it sends it (the first header is dated
// at the send, not at the claim); a header signed ahead used however old
// (the second is dated at the claim).
func TestHandedOffRowsAreSignedAheadWhileFresh(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := newListener(t, nil)
	claimedAt := time.Now().Truncate(time.Second)
	var sinceClaim atomic.Int64 // nanoseconds past claimedAt
	d, m, _ := f.deliverer(routesOf(l), 5*time.Second, testCAs(l),
		WithClock(clock.Stub(func() time.Time { return claimedAt.Add(time.Duration(sinceClaim.Load())) })))
	w := NewWorker(f.pool, routesOf(l), d)
	target := newPubkey(t)
	f.register(l.pubHex, target)

	for i, wait := range []time.Duration{signedFreshFor - time.Second, signedFreshFor + time.Second} {
		sinceClaim.Store(0)
		require.Eventually(t, func() bool { return !w.signing.Load() }, waitLong, time.Millisecond, "the last signing ahead is over")
		f.save(message(t, 9, target), w, true) // claimed, signed ahead, committed, offered
		c := <-w.handoff
		require.NotNil(t, c.signed)
		sinceClaim.Store(int64(wait))
		d.deliver(context.Background(), c)

		got := l.requests()
		require.Len(t, got, i+1)
		req := &http.Request{Method: http.MethodPost, Header: got[i].Header}
		authEv, err := verifyNIP98(req, got[i].Body, l.url)
		require.NoError(t, err)
		signedAt := claimedAt
		if wait >= signedFreshFor {
			signedAt = claimedAt.Add(wait)
		}
		require.Equal(t, signedAt.Unix(), authEv.CreatedAt, "POSTed %s after its claim", wait)
	}
	require.Equal(t, float64(2), outcomes(m)[outcomeAccepted])
}

// Under a flood of mentions rows are signed as they are sent: while rows
// wait in the hand-off, or another event's rows are being signed, an
// event's claimed rows are not signed ahead (a commit group's events each
// claim up to the hand-off's room, and Offer drops what does not fit).
// Mutations killed: signAhead without the hand-off check (the second
// event's row is signed ahead); without the one-event-at-a-time flag (the
// third's is).
func TestRowsAreSignedAheadOnlyWhileTheWorkerIsIdle(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := newListener(t, nil)
	d, _, _ := f.deliverer(routesOf(l), 5*time.Second, testCAs(l))
	w := NewWorker(f.pool, routesOf(l), d)
	target := newPubkey(t)
	f.register(l.pubHex, target)
	idle := func() bool { return !w.signing.Load() }

	f.save(message(t, 9, target), w, true) // idle: signed ahead, left in the hand-off
	require.Eventually(t, idle, waitLong, time.Millisecond)
	f.save(message(t, 9, target), w, true) // a row waits in the hand-off
	first, second := <-w.handoff, <-w.handoff
	require.NotNil(t, first.signed, "signed ahead on an idle worker")
	require.Nil(t, second.signed, "not signed ahead while a row waits in the hand-off")

	w.signing.Store(true) // another event's rows are being signed
	f.save(message(t, 9, target), w, true)
	third := <-w.handoff
	require.Nil(t, third.signed, "not signed ahead while another event's rows are")
	w.signing.Store(false)

	for _, c := range []claim{first, second, third} {
		d.deliver(context.Background(), c)
	}
	require.Len(t, l.requests(), 3, "signed ahead or not, each is delivered")
}
