package relay_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
	"github.com/buzzrelay/buzz/internal/trace"
)

// lookupCounter counts executions of the tenant-independent channel lookup.
type lookupCounter struct{ n atomic.Int64 }

func (l *lookupCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, "name: ChannelCommunities") {
		l.n.Add(1)
	}
	return ctx
}

func (l *lookupCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func countingPool(t *testing.T) (*pgxpool.Pool, *lookupCounter) {
	counter := &lookupCounter{}
	pool := dbtest.PoolOn(t, dbtest.URL(t), 0, func(c *pgxpool.Config) { c.ConnConfig.Tracer = counter })
	return pool, counter
}

// With no tracer observing (production), a REQ never runs the trace-only
// channel lookup; under a live tracer it runs and the trace names each
// row's true community. Mutation killed: gating on the request state alone
// (not tracer.Enabled()) makes the first half fail.
func TestTraceOnlyLookupRunsOnlyUnderALiveTracer(t *testing.T) {
	t.Parallel()
	for _, live := range []bool{false, true} {
		pool, counter := countingPool(t)
		r := relaytest.StartOn(t, pool)
		mem := &trace.MemoryTracer{}
		if live {
			r.Server.Tracer = trace.NewCountingTracer(mem)
		} else {
			r.Server.Tracer = trace.NewCountingTracer(trace.NoopTracer{})
		}
		c := r.Dial(t, "")
		c.Auth(nil)
		ch := createChannel(t, c, "traced", false)
		require.True(t, c.Publish(c.Sign(9, "hi", nostr.Tags{{"h", ch}}, 0)).OK)
		require.True(t, c.Publish(c.Sign(1, "global", nil, 0)).OK)
		require.Len(t, c.Req("pinned", map[string]any{"kinds": []int{9}, "#h": []string{ch}}, map[string]any{"kinds": []int{1}}), 2)

		if !live {
			require.Zero(t, counter.n.Load(), "no tracer observes: the lookup must not run")
			require.Empty(t, mem.Steps())
			continue
		}
		require.Equal(t, int64(1), counter.n.Load())
		var rows *trace.ReadMessageRows
		for _, step := range mem.Steps() {
			if a, ok := step.Action.(trace.ReadMessageRows); ok {
				rows = &a
			}
		}
		require.NotNil(t, rows, "steps: %+v", mem.Steps())
		want := trace.CommunityLabelFor(r.CommunityID)
		require.Equal(t, []trace.CommunityLabel{want, want}, rows.RowCommunities)
	}
}
