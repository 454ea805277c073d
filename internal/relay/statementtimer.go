package relay

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// StatementTimer is a pgx query tracer that times every statement carrying
// a "-- name: X" first line (every generated query, and the event store's
// hand-built REQ/COUNT statements) in buzz_db_query_seconds{query="X"}.
// Install it on the pool's connection config before creating the pool; New
// finds it there and attaches the relay's histogram. Statements without a
// name line are not timed.
type StatementTimer struct {
	observe atomic.Pointer[func(name string, seconds float64)]
}

// NewStatementTimer returns a timer that records nothing until a relay
// built on its pool attaches its metrics.
func NewStatementTimer() *StatementTimer { return &StatementTimer{} }

type statementStartKey struct{}

type statementStart struct {
	name string
	at   time.Time
}

// TraceQueryStart implements pgx.QueryTracer.
func (t *StatementTimer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	name := statementName(data.SQL)
	if name == "" || t.observe.Load() == nil {
		return ctx
	}
	return context.WithValue(ctx, statementStartKey{}, statementStart{name: name, at: time.Now()})
}

// TraceQueryEnd implements pgx.QueryTracer.
func (t *StatementTimer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	start, ok := ctx.Value(statementStartKey{}).(statementStart)
	if !ok {
		return
	}
	if observe := t.observe.Load(); observe != nil {
		(*observe)(start.name, time.Since(start.at).Seconds())
	}
}

type batchClockKey struct{}

// batchClock is when the batch's previous result came back (its start for
// the first): each statement of a batch is timed from there to its own
// result, as pgx reads them in order. That includes the caller's work in
// between, such as scanning a statement's rows (pgx traces a query when its
// rows close): fine for the batches sent today (a COUNT's one row, a
// group's inserts), an overstatement for one that streams many rows.
type batchClock struct{ at time.Time }

// TraceBatchStart implements pgx.BatchTracer: pgx calls the batch hooks,
// not the query ones, for the statements of a batch (a COUNT's, a group's
// inserts).
func (t *StatementTimer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	if t.observe.Load() == nil {
		return ctx
	}
	return context.WithValue(ctx, batchClockKey{}, &batchClock{at: time.Now()})
}

// TraceBatchQuery implements pgx.BatchTracer.
func (t *StatementTimer) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	clock, ok := ctx.Value(batchClockKey{}).(*batchClock)
	if !ok {
		return
	}
	now := time.Now()
	if name := statementName(data.SQL); name != "" {
		if observe := t.observe.Load(); observe != nil {
			(*observe)(name, now.Sub(clock.at).Seconds())
		}
	}
	clock.at = now
}

// TraceBatchEnd implements pgx.BatchTracer.
func (t *StatementTimer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (t *StatementTimer) attach(observe func(name string, seconds float64)) {
	t.observe.Store(&observe)
}

// statementName reads "X" from a first line "-- name: X ..." (sqlc adds the
// command, as in "-- name: EventInsert :execrows").
func statementName(sql string) string {
	rest, ok := strings.CutPrefix(sql, "-- name: ")
	if !ok {
		return ""
	}
	end := strings.IndexAny(rest, " \n\t\r")
	if end < 0 {
		return rest
	}
	return rest[:end]
}
