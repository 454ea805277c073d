package outbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/nostr"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

const testHost = "team.example"

// fixture is one fresh migrated database with one community.
type fixture struct {
	t         testing.TB
	pool      *pgxpool.Pool
	q         *db.Queries
	community uuid.UUID
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	return fixtureOn(t, dbtest.Pool(t))
}

// fixtureOn creates the community in the database behind pool.
func fixtureOn(t testing.TB, pool *pgxpool.Pool) *fixture {
	t.Helper()
	q := db.New(pool)
	c, err := q.CommunityCreate(context.Background(), testHost)
	require.NoError(t, err)
	return &fixture{t: t, pool: pool, q: q, community: c.ID}
}

// otherCommunity creates another community, host, in f's database.
func (f *fixture) otherCommunity(host string) *fixture {
	f.t.Helper()
	c, err := f.q.CommunityCreate(context.Background(), host)
	require.NoError(f.t, err)
	return &fixture{t: f.t, pool: f.pool, q: f.q, community: c.ID}
}

// newKey returns a random key and its hex pubkey.
func newKey(t testing.TB) (*nostr.SecretKey, string) {
	t.Helper()
	k, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	return k, k.PublicKeyHex()
}

func newPubkey(t testing.TB) string {
	_, pub := newKey(t)
	return pub
}

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	require.NoError(t, err)
	return b
}

// register registers targets for listener.
func (f *fixture) register(listener string, targets ...string) {
	f.t.Helper()
	bs := make([][]byte, len(targets))
	for i, tg := range targets {
		bs[i] = mustHex(f.t, tg)
	}
	_, err := f.q.ListenerRegistrationsUpsert(context.Background(), db.ListenerRegistrationsUpsertParams{
		Listener: mustHex(f.t, listener), Targets: bs,
	})
	require.NoError(f.t, err)
}

// message returns a signed event of kind that p-tags targets.
func message(t testing.TB, kind int, targets ...string) *nostr.Event {
	t.Helper()
	k, _ := newKey(t)
	ev := &nostr.Event{Kind: kind, CreatedAt: time.Now().Unix(), Content: "hello " + uuid.NewString()}
	for _, tg := range targets {
		ev.Tags = append(ev.Tags, nostr.Tag{"p", tg})
	}
	require.NoError(t, ev.Sign(k))
	return ev
}

// save runs the write spine's part the relay wires up: in one transaction
// insert the event and, only if it was new, Enqueue for w (which may be
// nil); then, only after a successful commit, Offer what it claimed to w.
// kept are the ids of the rows claimed for w.
func (f *fixture) save(ev *nostr.Event, w *Worker, commit bool) (kept []uuid.UUID, inserted int64) {
	f.t.Helper()
	kept, inserted, _ = f.saveTimed(ev, w, commit)
	return kept, inserted
}

// saveTimed is save, also returning when the commit returned (just before
// the hand-off).
func (f *fixture) saveTimed(ev *nostr.Event, w *Worker, commit bool) (kept []uuid.UUID, inserted int64, committed time.Time) {
	f.t.Helper()
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	require.NoError(f.t, err)
	defer tx.Rollback(ctx)
	q := db.New(tx)
	params, err := eventstore.InsertParams(f.community, ev, nil)
	require.NoError(f.t, err)
	n, err := q.EventInsert(ctx, params)
	require.NoError(f.t, err)
	var claimed Handoff
	if n == 1 {
		claimed, inserted, err = Enqueue(ctx, q, w, f.community, nil, ev, 0, clock.Wall())
		require.NoError(f.t, err)
	}
	if !commit {
		require.NoError(f.t, tx.Rollback(ctx))
		w.Abandon(claimed)
		return claimed.IDs(), inserted, time.Time{}
	}
	require.NoError(f.t, tx.Commit(ctx))
	committed = time.Now()
	w.Offer(claimed)
	return claimed.IDs(), inserted, committed
}

// begin inserts ev and enqueues its mentions, claiming for w, in a
// transaction it leaves open (rolled back when the test ends).
func (f *fixture) begin(ev *nostr.Event, w *Worker) (pgx.Tx, Handoff) {
	f.t.Helper()
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	require.NoError(f.t, err)
	f.t.Cleanup(func() { _ = tx.Rollback(ctx) })
	params, err := eventstore.InsertParams(f.community, ev, nil)
	require.NoError(f.t, err)
	_, err = db.New(tx).EventInsert(ctx, params)
	require.NoError(f.t, err)
	h, _, err := Enqueue(ctx, db.New(tx), w, f.community, nil, ev, 0, clock.Wall())
	require.NoError(f.t, err)
	return tx, h
}

// saveIn stores ev in channel (nil: none) and queues its mentions, none
// claimed at insert.
func (f *fixture) saveIn(ev *nostr.Event, channel *uuid.UUID) {
	f.t.Helper()
	ctx := context.Background()
	params, err := eventstore.InsertParams(f.community, ev, channel)
	require.NoError(f.t, err)
	require.NoError(f.t, pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		if _, err := q.EventInsert(ctx, params); err != nil {
			return err
		}
		_, _, err := Enqueue(ctx, q, nil, f.community, channel, ev, 0, clock.Wall())
		return err
	}))
}

// enqueue saves a kind-9 message mentioning targets and returns the new
// outbox ids (all of them, from the database).
func (f *fixture) enqueue(targets ...string) []uuid.UUID {
	f.t.Helper()
	ev := message(f.t, 9, targets...)
	f.save(ev, nil, true)
	return f.outboxIDs(ev)
}

func (f *fixture) outboxIDs(ev *nostr.Event) []uuid.UUID {
	f.t.Helper()
	id := ev.IDBytes()
	rows, err := f.pool.Query(context.Background(),
		`SELECT id FROM operator_listener_outbox WHERE event_id = $1 ORDER BY id`, id[:])
	require.NoError(f.t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	require.NoError(f.t, err)
	return ids
}

// outboxRow is a row's delivery state.
type outboxRow struct {
	State       string
	Attempts    int32
	ClaimID     *uuid.UUID
	LeaseUntil  *time.Time
	DueIn       time.Duration // next_attempt_at - now(), database clock
	ListenerHex string
}

// row returns the state of outbox row id; ok is false when it is gone.
func (f *fixture) row(id uuid.UUID) (r outboxRow, ok bool) {
	f.t.Helper()
	var dueMs float64
	err := f.pool.QueryRow(context.Background(), `
		SELECT state, attempts, claim_id, lease_until,
		       extract(epoch FROM next_attempt_at - now()) * 1000, encode(listener_pubkey, 'hex')
		FROM operator_listener_outbox WHERE id = $1`, id).
		Scan(&r.State, &r.Attempts, &r.ClaimID, &r.LeaseUntil, &dueMs, &r.ListenerHex)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false
	}
	require.NoError(f.t, err)
	r.DueIn = time.Duration(dueMs) * time.Millisecond
	return r, true
}

// requireDueIn requires that a row rescheduled after since is due want
// after that moment: its DueIn, read now, lies between want minus the time
// elapsed since since and want (plus a little clock slack). A fixed
// tolerance would fail whenever a loaded machine took longer than it
// between the update and the read.
func requireDueIn(t *testing.T, want time.Duration, r outboxRow, since time.Time, msgAndArgs ...any) {
	t.Helper()
	const slack = 50 * time.Millisecond
	require.LessOrEqual(t, r.DueIn, want+slack, msgAndArgs...)
	require.GreaterOrEqual(t, r.DueIn, want-time.Since(since)-slack, msgAndArgs...)
}

func (f *fixture) outboxCount() int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.pool.QueryRow(context.Background(), `SELECT count(*) FROM operator_listener_outbox`).Scan(&n))
	return n
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	_, err := f.pool.Exec(context.Background(), sql, args...)
	require.NoError(f.t, err)
}

// claimer returns the production claimer for routes on this database.
func (f *fixture) claimer(routes Routes) pgClaimer {
	return pgClaimer{q: f.q, routable: routes.pubkeys(), lease: defaultLease, cursor: newWalkCursor()}
}

// received is one request a test listener got.
type received struct {
	Header http.Header
	Body   []byte
	URL    string
	At     time.Time
}

// testListener is an operator listener: a real HTTPS server on loopback.
type testListener struct {
	srv    *httptest.Server
	pubHex string // the listener's identity (its routes key)
	url    string // the configured delivery URL

	mu  sync.Mutex
	got []received
}

// newListener starts a listener that records each request, then answers
// with handle (200 when nil).
func newListener(t testing.TB, handle http.HandlerFunc) *testListener {
	t.Helper()
	l := &testListener{pubHex: newPubkey(t)}
	l.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		body, _ := io.ReadAll(r.Body)
		l.mu.Lock()
		l.got = append(l.got, received{Header: r.Header.Clone(), Body: body, URL: r.URL.String(), At: at})
		l.mu.Unlock()
		if handle != nil {
			handle(w, r)
		}
	}))
	t.Cleanup(l.srv.Close)
	l.url = l.srv.URL + "/hooks/buzz"
	return l
}

func (l *testListener) requests() []received {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]received(nil), l.got...)
}

// routes is the relay configuration naming these listeners.
func routesOf(ls ...*testListener) Routes {
	r := Routes{}
	for _, l := range ls {
		r[l.pubHex] = l.url
	}
	return r
}

// testCAs trusts httptest's TLS certificate (shared by all its servers).
func testCAs(l *testListener) *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(l.srv.Certificate())
	return pool
}

// logBuffer collects log output for assertions.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// deliverer returns a deliverer for routes, trusting the test listeners'
// certificate, with its own metrics and captured logs.
func (f *fixture) deliverer(routes Routes, timeout time.Duration, ca *x509.CertPool, more ...DelivererOption) (*Deliverer, *Metrics, *logBuffer) {
	f.t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(f.t, err)
	relayKey, _ := newKey(f.t)
	logs := &logBuffer{}
	f.t.Cleanup(func() {
		if f.t.Failed() {
			f.t.Logf("the deliverer's log:\n%s", logs.String())
		}
	})
	opts := []DelivererOption{WithLogger(slog.New(slog.NewTextHandler(logs, nil)))}
	if ca != nil {
		opts = append(opts, WithRootCAs(ca))
	}
	opts = append(opts, more...)
	d := NewDeliverer(f.pool, Config{Listeners: routes, Timeout: timeout}, relayKey, m, opts...)
	return d, m, logs
}

// verifyNIP98 is a receiver-side NIP-98 check, written for the tests: a
// signed kind-27235 event within ±60 s, u = expectedURL, method = the
// request's, payload = SHA-256 of body (required). It returns the event.
func verifyNIP98(r *http.Request, body []byte, expectedURL string) (*nostr.Event, error) {
	scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if scheme != "Nostr" {
		return nil, errors.New("Authorization scheme must be Nostr")
	}
	raw, err := base64.StdEncoding.DecodeString(token)
	if err != nil {
		return nil, errors.New("token is not base64")
	}
	ev, err := nostr.ParseEvent(raw, nostr.Limits{})
	if err != nil {
		return nil, err
	}
	if err := ev.Verify(); err != nil {
		return nil, err
	}
	if ev.Kind != nostr.KindHTTPAuth {
		return nil, errors.New("kind must be 27235")
	}
	if skew := time.Since(time.Unix(ev.CreatedAt, 0)); skew > time.Minute || skew < -time.Minute {
		return nil, errors.New("created_at out of window")
	}
	if tag := ev.Tags.First("u"); tag == nil || tag[1] != expectedURL {
		return nil, fmt.Errorf("u tag must be %s", expectedURL)
	}
	if tag := ev.Tags.First("method"); tag == nil || tag[1] != r.Method {
		return nil, errors.New("method tag mismatch")
	}
	sum := sha256.Sum256(body)
	if tag := ev.Tags.First("payload"); tag == nil || tag[1] != hex.EncodeToString(sum[:]) {
		return nil, errors.New("payload tag mismatch")
	}
	return ev, nil
}

// signNIP98 builds an Authorization header as a listener would.
func signNIP98(t testing.TB, key *nostr.SecretKey, method, url string, body []byte) string {
	t.Helper()
	sum := sha256.Sum256(body)
	ev := &nostr.Event{Kind: nostr.KindHTTPAuth, CreatedAt: time.Now().Unix(), Tags: nostr.Tags{
		{"u", url}, {"method", method}, {"payload", hex.EncodeToString(sum[:])},
	}}
	require.NoError(t, ev.Sign(key))
	raw, err := ev.MarshalJSON()
	require.NoError(t, err)
	return "Nostr " + base64.StdEncoding.EncodeToString(raw)
}

// wait receives from ch or fails after timeout.
func wait[T any](t testing.TB, ch <-chan T, timeout time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
		panic("unreachable")
	}
}
