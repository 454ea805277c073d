package trace

import (
	"encoding/json"
	"io"
	"sync"
	"sync/atomic"
)

// Tracer receives trace steps.
//
// Enabled reports whether recorded steps are observed at all. Call sites use it
// to skip building trace-only inputs (see the package documentation); it never
// changes what a live tracer receives. Every implementation states it
// explicitly.
type Tracer interface {
	Record(step TraceStep)
	Enabled() bool
}

// Active reports whether a call site should build emit inputs and record:
// the request has trace state and the tracer is listening.
func Active(t Tracer, st *AbstractState) bool {
	return st != nil && t != nil && t.Enabled()
}

// NoopTracer is the production binding: it discards steps and reports
// Enabled() == false.
type NoopTracer struct{}

// Record discards step.
func (NoopTracer) Record(TraceStep) {}

// Enabled reports false.
func (NoopTracer) Enabled() bool { return false }

// JSONLTracer writes each step as one JSON line to an io.Writer. It is safe for
// concurrent use and reports Enabled() == true.
type JSONLTracer struct {
	mu  sync.Mutex
	enc *json.Encoder
	err error
}

// NewJSONLTracer returns a tracer writing JSON lines to w.
func NewJSONLTracer(w io.Writer) *JSONLTracer {
	return &JSONLTracer{enc: json.NewEncoder(w)}
}

// Record writes step as a single line. After the first write or encoding error
// further steps are dropped; see Err.
func (t *JSONLTracer) Record(step TraceStep) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil {
		return
	}
	t.err = t.enc.Encode(step)
}

// Enabled reports true.
func (t *JSONLTracer) Enabled() bool { return true }

// Err returns the first error encountered while writing, if any.
func (t *JSONLTracer) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// MemoryTracer collects steps in memory, for tests. It is safe for concurrent
// use and reports Enabled() == true.
type MemoryTracer struct {
	mu    sync.Mutex
	steps []TraceStep
}

// Record appends step.
func (t *MemoryTracer) Record(step TraceStep) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.steps = append(t.steps, step)
}

// Enabled reports true.
func (t *MemoryTracer) Enabled() bool { return true }

// Steps returns a copy of the steps recorded so far.
func (t *MemoryTracer) Steps() []TraceStep {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]TraceStep(nil), t.steps...)
}

// CountingTracer counts the steps recorded through it and forwards them to an
// inner tracer. Enabled delegates to the inner tracer.
type CountingTracer struct {
	inner Tracer
	count atomic.Uint64
}

// NewCountingTracer wraps inner; a nil inner is treated as NoopTracer.
func NewCountingTracer(inner Tracer) *CountingTracer {
	if inner == nil {
		inner = NoopTracer{}
	}
	return &CountingTracer{inner: inner}
}

// Record counts step, then forwards it to the inner tracer.
func (t *CountingTracer) Record(step TraceStep) {
	t.count.Add(1)
	t.inner.Record(step)
}

// Enabled reports whether the inner tracer is enabled. It must not be
// hardcoded either way: true would keep trace-only reads in production, false
// would suppress emits and make EmitGuard report impl_bug for correct seams.
func (t *CountingTracer) Enabled() bool { return t.inner.Enabled() }

// Count returns the number of steps recorded so far.
func (t *CountingTracer) Count() uint64 { return t.count.Load() }
