package workflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// testClock is a clock tests move by hand.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// fixture is one community on its own database with a pipeline that has
// workflows registered, and a clock the engine and the pipeline share.
type fixture struct {
	t      testing.TB
	ctx    context.Context
	pool   *pgxpool.Pool
	tenant community.Tenant
	p      *ingest.Pipeline
	clock  *testClock
	offers chan []uuid.UUID
	// reg holds the workflow metrics that the fixture's triggers and
	// engines record.
	reg     *prometheus.Registry
	metrics *workflow.Metrics
	// triggers are the pipeline's registered triggers.
	triggers *workflow.Triggers
}

func newFixture(t *testing.T) *fixture { return newFixtureMax(t, 0) }

// newFixtureMax is newFixture with a bound on each workflow's unfinished
// runs (0: the default).
// Schedules may fire every second, so that the scheduler's tests need not
// wait for minutes; TestScheduleSlotsAreAtLeastAMinuteApart saves under the
// default.
func newFixtureMax(t *testing.T, maxUnfinished int) *fixture {
	return newFixtureWith(t, ingest.Options{}, workflow.Triggers{MaxUnfinishedRuns: maxUnfinished, MinScheduleInterval: time.Second})
}

// newFixtureWith builds the fixture's pipeline with opts and its triggers
// with the settings of triggers (Metrics is the fixture's; the fixture's
// Offer records the offered ids, then calls triggers.Offer if set).
func newFixtureWith(t testing.TB, opts ingest.Options, triggers workflow.Triggers) *fixture {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dbtest.URL(t))
	require.NoError(t, err)
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	row, err := db.New(pool).CommunityCreate(ctx, "wf-"+uuid.NewString()[:8]+".example")
	require.NoError(t, err)
	tc := &testClock{now: time.Now().Truncate(time.Second)}
	f := &fixture{t: t, ctx: ctx, pool: pool, tenant: community.FromRow(row), clock: tc, offers: make(chan []uuid.UUID, 100)}
	opts.MaxFutureSkew, opts.Clock = time.Minute, clock.Stub(tc.Now)
	f.p = ingest.New(pool, fanout.NewHub(), opts)
	f.reg = prometheus.NewRegistry()
	f.metrics, err = workflow.NewMetrics(f.reg)
	require.NoError(t, err)
	offer := triggers.Offer
	triggers.Offer = func(community uuid.UUID, ids []uuid.UUID) {
		f.offers <- ids
		if offer != nil {
			offer(community, ids)
		}
	}
	triggers.Metrics = f.metrics
	workflow.RegisterTriggers(f.p, &triggers)
	f.triggers = &triggers
	return f
}

func (f *fixture) engine(lease time.Duration) *workflow.Engine {
	return workflow.NewEngine(f.pool, f.p, workflow.EngineOptions{Lease: lease, Clock: clock.Stub(f.clock.Now), Metrics: f.metrics})
}

func (f *fixture) key() *nostr.SecretKey {
	k, err := nostr.GenerateSecretKey()
	require.NoError(f.t, err)
	return k
}

func (f *fixture) sign(key *nostr.SecretKey, kind int, content string, tags nostr.Tags) *nostr.Event {
	f.t.Helper()
	if tags == nil {
		tags = nostr.Tags{}
	}
	ev := &nostr.Event{Kind: kind, Content: content, Tags: tags, CreatedAt: f.clock.Now().Unix() - 1}
	require.NoError(f.t, ev.Sign(key))
	return ev
}

// submit returns the OK message of a stored event, or the rejection.
func (f *fixture) submit(ev *nostr.Event) (string, error) {
	_, reply, err := f.p.SubmitReply(f.ctx, f.tenant, ev.PubKey, ev)
	return reply, err
}

func (f *fixture) store(ev *nostr.Event) string {
	f.t.Helper()
	out, reply, err := f.p.SubmitReply(f.ctx, f.tenant, ev.PubKey, ev)
	require.NoError(f.t, err)
	require.Equal(f.t, ingest.Stored, out)
	return reply
}

func (f *fixture) rejected(ev *nostr.Event, want string) {
	f.t.Helper()
	_, err := f.submit(ev)
	var rej *ingest.Rejection
	require.True(f.t, errors.As(err, &rej), "want rejection %q, got %v", want, err)
	require.Equal(f.t, want, rej.Error())
}

// channel creates an open channel owned by owner, with members joined.
func (f *fixture) channel(owner *nostr.SecretKey, members ...*nostr.SecretKey) string {
	f.t.Helper()
	id := uuid.NewString()
	f.store(f.sign(owner, ingest.KindCreateGroup, "", nostr.Tags{{"h", id}, {"name", "room"}}))
	for _, m := range members {
		f.store(f.sign(m, ingest.KindJoinRequest, "", nostr.Tags{{"h", id}}))
	}
	return id
}

// privateChannel creates a private channel of owner's and puts members in.
func (f *fixture) privateChannel(owner *nostr.SecretKey, members ...*nostr.SecretKey) string {
	f.t.Helper()
	id := uuid.NewString()
	f.store(f.sign(owner, ingest.KindCreateGroup, "", nostr.Tags{{"h", id}, {"name", "secret"}, {"visibility", "private"}}))
	for _, m := range members {
		f.store(f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", id}, {"p", pubHex(m)}}))
	}
	return id
}

// profile gives key a display name.
func (f *fixture) profile(key *nostr.SecretKey, name string) {
	f.t.Helper()
	body, _ := json.Marshal(map[string]string{"display_name": name})
	f.store(f.sign(key, nostr.KindMetadata, string(body), nil))
}

// save publishes a definition and returns the event and the OK reply.
func (f *fixture) save(owner *nostr.SecretKey, channel, workflowID, yaml string) (*nostr.Event, string) {
	f.t.Helper()
	ev := f.sign(owner, workflow.KindDefinition, yaml, nostr.Tags{{"d", workflowID}, {"h", channel}})
	return ev, f.store(ev)
}

func (f *fixture) count(sql string, args ...any) int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.pool.QueryRow(f.ctx, sql, args...).Scan(&n))
	return n
}

func (f *fixture) run(id uuid.UUID) db.WorkflowRunGetRow {
	f.t.Helper()
	r, err := db.New(f.pool).WorkflowRunGet(f.ctx, db.WorkflowRunGetParams{CommunityID: f.tenant.ID(), ID: id})
	require.NoError(f.t, err)
	return r
}

// runIDs lists the workflow's runs, oldest first.
func (f *fixture) runIDs(workflowID string) []uuid.UUID {
	f.t.Helper()
	rows, err := f.pool.Query(f.ctx, `SELECT id FROM workflow_runs WHERE community_id = $1 AND workflow_id = $2 ORDER BY created_at, id`, f.tenant.ID(), workflowID)
	require.NoError(f.t, err)
	var out []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		require.NoError(f.t, rows.Scan(&id))
		out = append(out, id)
	}
	require.NoError(f.t, rows.Err())
	return out
}

// drain claims and executes every due run with e until none is due.
func (f *fixture) drain(e *workflow.Engine) {
	f.t.Helper()
	for {
		claims, err := e.ClaimDue(f.ctx, 10)
		require.NoError(f.t, err)
		if len(claims) == 0 {
			return
		}
		for _, c := range claims {
			e.Execute(f.ctx, c)
		}
	}
}
