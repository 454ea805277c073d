// Package trace is the relay's conformance seam: a small, production-type-free
// schema of abstract trace steps plus the Tracer interface the relay emits them
// through.
//
// Production binds NoopTracer, whose Enabled reports false. Conformance and test
// runs bind a live tracer (JSONLTracer, MemoryTracer), whose Enabled reports
// true. Tests read the recorded steps back and check the properties the
// relay promises, chiefly non-interference: no row owned by one community
// ever reaches a reader bound to another.
//
// # The gating rule
//
// Some emit inputs exist only for the trace. The canonical example is the
// tenant-independent channel→community lookup
//
//	SELECT id, community_id FROM channels WHERE id = ANY($1) AND deleted_at IS NULL
//
// which projects every returned row's true owning community regardless of the
// fetch query's WHERE clause. Production has no use for its result, so call sites
// must build such inputs only when a tracer is listening, in addition to having a
// non-nil request state:
//
//	if st != nil && tracer.Enabled() {
//		lookup, err := db.ChannelCommunities(ctx, ids) // trace-only read
//		...
//		trace.RecordReadMessageRows(tracer, *st, filterChannel, rowChannels, resolved, lookup)
//	}
//
// Active(tracer, st) spells that condition. Guarding on the state alone is the
// eager-argument bug (the state is non-nil for every well-formed request), and it
// runs the lookup once per filter on the hot read path only to discard it.
//
// The gate skips building inputs nobody observes; it never skips an emit that a
// live tracer would have received. Under a live tracer every emit happens exactly
// as before, so the coverage-breach guard stays non-vacuous.
//
// # CountingTracer and EmitGuard
//
// EmitGuard (see Arm) wraps the request's tracer in a CountingTracer and records
// impl_bug{kind} if the request finished without a single emit. CountingTracer
// delegates Enabled to its inner tracer. Both alternatives fail silently:
// hardcoding true would keep the trace-only reads in production, and hardcoding
// false would suppress the emits whose absence EmitGuard then reports as impl_bug.
//
// # Lookup coverage
//
// A row whose channel is missing from the lookup is a coverage breach
// (*MissingLookup, kind row_community_lookup_missing), recorded as impl_bug. It
// is never papered over by substituting the resolved community: doing so would
// make the non-interference check vacuous.
package trace
