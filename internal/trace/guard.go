package trace

import "sync"

// Implementation-bug kinds recorded by this package's callers and helpers.
const (
	// KindIngestExitedWithoutTrace marks an ingest that returned without emitting.
	KindIngestExitedWithoutTrace = "ingest_exited_without_trace"
	// KindRowCommunityLookupMissing marks a returned row whose channel was not
	// covered by the channel→community lookup.
	KindRowCommunityLookupMissing = "row_community_lookup_missing"
)

// EmitGuard reports a request that finished without emitting a single step.
type EmitGuard struct {
	inner   Tracer
	counter *CountingTracer
	state   AbstractState
	kind    string
	once    sync.Once
}

// Arm returns a guard and the counting tracer the request must emit through.
// Release the guard with defer guard.Close().
func Arm(inner Tracer, state AbstractState, kind string) (*EmitGuard, *CountingTracer) {
	counter := NewCountingTracer(inner)
	return &EmitGuard{inner: counter.inner, counter: counter, state: state, kind: kind}, counter
}

// Close records exactly one impl_bug{kind} step on the inner tracer if no step
// reached the counting tracer; otherwise it does nothing. Only the first call
// has an effect.
func (g *EmitGuard) Close() {
	g.once.Do(func() {
		if g.counter.Count() == 0 {
			g.inner.Record(NewStep(ImplBug{Kind: g.kind}, g.state))
		}
	})
}
