package workflow_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
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

// benchFixture: a pipeline with workflows registered, a worker on the wall
// clock whose hand-off receives the runs the pipeline creates, and a
// channel with a two-step workflow (two send_message steps).
func benchFixture(b *testing.B) (*fixture, *nostr.SecretKey, string) {
	return benchFixtureWith(b, twoSteps)
}

// benchFixtureWith is benchFixture with the channel's workflow defined by
// yaml.
func benchFixtureWith(b *testing.B, yaml string) (*fixture, *nostr.SecretKey, string) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dbtest.URL(b))
	require.NoError(b, err)
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	row, err := db.New(pool).CommunityCreate(ctx, "bench.example")
	require.NoError(b, err)
	f := &fixture{t: b, ctx: ctx, pool: pool, tenant: community.FromRow(row), clock: &testClock{now: time.Now()}}
	f.p = ingest.New(pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: time.Minute})
	w := workflow.NewWorker(workflow.NewEngine(pool, f.p, workflow.EngineOptions{Clock: clock.Wall()}), workflow.WorkerOptions{Poll: 50 * time.Millisecond})
	// Unbounded queue: the benchmarks measure execution, and a refused
	// run would never complete.
	workflow.RegisterTriggers(f.p, &workflow.Triggers{Offer: w.Offer, MaxUnfinishedRuns: math.MaxInt32})
	runCtx, cancel := context.WithCancel(ctx)
	b.Cleanup(cancel)
	go w.Run(runCtx)
	owner := f.key()
	ch := f.channel(owner)
	f.save(owner, ch, uuid.NewString(), yaml)
	return f, owner, ch
}

// benchMessage submits a message with content into channel ch, signed by
// owner, and returns it.
func benchMessage(b *testing.B, f *fixture, owner *nostr.SecretKey, ch, content string) *nostr.Event {
	ev := &nostr.Event{Kind: ingest.KindChat, Content: content, Tags: nostr.Tags{{"h", ch}}, CreatedAt: time.Now().Unix()}
	require.NoError(b, ev.Sign(owner))
	_, err := f.p.Submit(f.ctx, f.tenant, ev.PubKey, ev)
	require.NoError(b, err)
	return ev
}

// BenchmarkMessageTriggerToFirstStep: from submitting a kind 9 to the
// workflow's first doorbell being stored (ns/op is that latency; the
// runs execute one at a time).
func BenchmarkMessageTriggerToFirstStep(b *testing.B) {
	f, owner, ch := benchFixture(b)
	i := 0
	for b.Loop() {
		i++
		ev := benchMessage(b, f, owner, ch, "m"+itoa(int64(i)))
		for {
			var n int
			require.NoError(b, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM events WHERE kind = 9 AND content = 'first'
				AND tags @> jsonb_build_array(jsonb_build_array('workflow-cause', 'event', $1::text))`, ev.ID).Scan(&n))
			if n > 0 {
				break
			}
		}
	}
}

// BenchmarkTwoStepRunsPerSecond: how many two-step runs one worker
// completes per second when triggers arrive as fast as they can (runs/s is
// reported).
func BenchmarkTwoStepRunsPerSecond(b *testing.B) {
	f, owner, ch := benchFixture(b)
	start := time.Now()
	for i := range b.N {
		benchMessage(b, f, owner, ch, "r"+itoa(int64(i)))
	}
	for {
		var n int
		require.NoError(b, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM workflow_runs WHERE status = 'completed'`).Scan(&n))
		if n >= b.N {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "runs/s")
}

// BenchmarkFiftyStepRun: from submitting a kind 9 to the end of its run
// of 50 steps, 49 of which an if skips (ns/op is that latency): what a
// step costs beyond its action, its transaction and reading the pinned
// definition, times 50.
func BenchmarkFiftyStepRun(b *testing.B) {
	f, owner, ch := benchFixtureWith(b, fiftySteps())
	i := 0
	for b.Loop() {
		i++
		benchMessage(b, f, owner, ch, "f"+itoa(int64(i)))
		for {
			var n int
			require.NoError(b, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM workflow_runs WHERE status = 'completed'`).Scan(&n))
			if n >= i {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// fiftySteps is a definition of 49 steps an if of about 200 bytes skips,
// then one send_message.
func fiftySteps() string {
	var s strings.Builder
	s.WriteString("name: fifty\ntrigger: {on: message_posted}\nsteps:\n")
	skip := `str_contains(trigger_text, "never")` + strings.Repeat(` && str_contains(trigger_text, "x")`, 5)
	for i := range 49 {
		fmt.Fprintf(&s, "  - {id: s%d, action: send_message, if: '%s', text: 'step %d'}\n", i, skip, i)
	}
	s.WriteString("  - {id: last, action: send_message, text: done}\n")
	return s.String()
}

// BenchmarkParallelTriggersOneWorkflow: messages posted concurrently into
// one channel whose one workflow they all trigger (no worker: the runs
// queue). Admission locks the workflow row for the tail of each event's
// transaction, so this is the cost of the exact bound where it is highest
// (events/s is reported).
func BenchmarkParallelTriggersOneWorkflow(b *testing.B) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dbtest.URL(b))
	require.NoError(b, err)
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	row, err := db.New(pool).CommunityCreate(ctx, "bench.example")
	require.NoError(b, err)
	f := &fixture{t: b, ctx: ctx, pool: pool, tenant: community.FromRow(row), clock: &testClock{now: time.Now()}}
	f.p = ingest.New(pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: time.Minute})
	workflow.RegisterTriggers(f.p, &workflow.Triggers{MaxUnfinishedRuns: math.MaxInt32})
	owner := f.key()
	ch := f.channel(owner)
	f.save(owner, ch, uuid.NewString(), twoSteps)
	var seq atomic.Int64
	start := time.Now()
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ev := &nostr.Event{Kind: ingest.KindChat, Content: "p" + itoa(seq.Add(1)), Tags: nostr.Tags{{"h", ch}}, CreatedAt: time.Now().Unix()}
			if err := ev.Sign(owner); err != nil {
				b.Error(err)
				return
			}
			if _, err := f.p.Submit(ctx, f.tenant, ev.PubKey, ev); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
}

// BenchmarkMessageIntoChannelOfFilteredWorkflows: storing a message in a
// channel with as many workflows as one may have, each with a filter the
// message does not meet (ns/op is the Submit latency; no run is created).
// Every filter is evaluated inside the message's write transaction.
func BenchmarkMessageIntoChannelOfFilteredWorkflows(b *testing.B) {
	f := newFixtureWith(b, ingest.Options{}, workflow.Triggers{})
	owner := f.key()
	ch := f.channel(owner)
	for i := range workflow.DefaultMaxPerChannel {
		f.save(owner, ch, uuid.NewString(), "name: F\ntrigger: {on: message_posted, filter: 'trigger_text contains \"deploy-"+
			itoa(int64(i))+"\" && trigger_author != \"nobody\"'}\nsteps: [{id: a, action: send_message, text: hi}]")
	}
	i := 0
	for b.Loop() {
		i++
		ev := &nostr.Event{Kind: ingest.KindChat, Content: "m" + itoa(int64(i)), Tags: nostr.Tags{{"h", ch}}, CreatedAt: f.clock.Now().Unix()}
		require.NoError(b, ev.Sign(owner))
		_, err := f.p.Submit(f.ctx, f.tenant, ev.PubKey, ev)
		require.NoError(b, err)
	}
	require.Zero(b, f.count(`SELECT count(*) FROM workflow_runs WHERE community_id = $1`, f.tenant.ID()))
}
