// Package ingest is the write spine: one path for every accepted event,
// whichever transport brought it. verify → per-kind validation → one
// transaction (authorize, the event row, then the kind's side rows and any
// relay-signed events) → commit → only then fan-out. A rollback leaves no side
// effect at all.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/presence"
)

// Outcome says what happened to an event that was not rejected.
type Outcome int

const (
	Stored     Outcome = iota // inserted and fanned out
	Duplicate                 // already stored in this community
	Superseded                // its deletion (by id or by slot), or a newer version of its slot, is stored
	Relayed                   // ephemeral: fanned out, never stored
)

// Message is the OK message text for an accepted outcome.
func (o Outcome) Message() string {
	switch o {
	case Duplicate:
		return "duplicate: already have this event"
	case Superseded:
		return "duplicate: this event's deletion, or a newer version of its address, is already stored"
	}
	return ""
}

// Rejection is a refusal with a NIP-01 machine-readable prefix.
type Rejection struct {
	Prefix string // invalid, restricted, blocked, rate-limited, duplicate, error ...
	Reason string
	// unknownChannel marks the answer shared by unknown and unreadable
	// channels, so a caller can answer its own "not found" instead.
	unknownChannel bool
	// memberLimit marks the refusal of an add to a full channel
	// (IsMemberLimit), which the relay counts apart.
	memberLimit bool
	// communityDeleted marks the deletion fence's refusal
	// (IsCommunityBeingDeleted), which HTTP answers 410.
	communityDeleted bool
}

// ErrCommunityBeingDeleted is the answer to a write the community's
// deletion fenced (from quiescing on, until its connections are closed): a
// refusal, not an internal error, because sending it again can never
// succeed.
func ErrCommunityBeingDeleted() error {
	return &Rejection{Prefix: "blocked", Reason: "this community is being deleted", communityDeleted: true}
}

// IsCommunityBeingDeleted reports whether err is the refusal of a write
// the community's deletion fenced.
func IsCommunityBeingDeleted(err error) bool {
	var rej *Rejection
	return errors.As(err, &rej) && rej.communityDeleted
}

func (r *Rejection) Error() string { return r.Prefix + ": " + r.Reason }

// Reject builds a *Rejection.
func Reject(prefix, format string, args ...any) error {
	return &Rejection{Prefix: prefix, Reason: fmt.Sprintf(format, args...)}
}

// Handler is the kind-specific part of ingest; any hook may be nil.
//   - Validate checks the event alone, before any database work.
//   - Prepare runs first in the transaction: resolve the channel, authorize.
//     For an ephemeral kind it runs without a transaction.
//   - Apply runs after the event row was inserted: side rows, relay-signed
//     events. It does not run for duplicates.
type Handler struct {
	Validate func(ev *nostr.Event) error
	Prepare  func(ctx context.Context, w *Write) error
	Apply    func(ctx context.Context, w *Write) error
	// LocksChannelRow: the handler locks its channel's row (as a workflow
	// save does) before its channel check; such an event is a group of
	// its own, like a membership change (see takeLocked).
	LocksChannelRow bool
}

// Write is one event on its way through the spine, handed to its handler.
type Write struct {
	Tenant community.Tenant
	Event  *nostr.Event
	// Actor is the authenticated pubkey (hex) that submitted the event.
	Actor string
	// Q runs queries in the event's transaction.
	Q *db.Queries
	// ChannelID is the event's channel; nil means community-global. Set by
	// Prepare, stored with the event and used to authorize fan-out.
	ChannelID *uuid.UUID

	// readersVersions are the readers_version of each channel whose
	// access row the write read (none: 0): the fan-out of what the write
	// stores in that channel does not trust a reader set cached before it.
	readersVersions   map[uuid.UUID]int64
	pipeline          *Pipeline
	emitted           []emittedEvent
	membershipChanged bool
	afterCommit       []func()
	onRollback        []func()
	// state carries what a handler's Prepare found on to its Apply.
	state any
	// reply is the OK message of a stored event (Reply).
	reply string
}

// SetState keeps what a handler's Prepare found for its Apply.
func (w *Write) SetState(v any) { w.state = v }

// State returns what SetState kept.
func (w *Write) State() any { return w.state }

// Reply sets the OK message sent when the event is stored (e.g. the
// "response:" of a command that created something the client needs the id
// of). It is dropped if the transaction rolls back.
func (w *Write) Reply(msg string) { w.reply = msg }

type emittedEvent struct {
	ev      *nostr.Event
	channel *uuid.UUID
}

// ActorBytes is Actor decoded.
func (w *Write) ActorBytes() []byte {
	b, _ := nostr.DecodeHex32(w.Actor)
	return b[:]
}

// AfterCommit schedules fn to run once the event's transaction committed,
// and never after a rollback (e.g. handing outbox ids to a local worker).
func (w *Write) AfterCommit(fn func()) { w.afterCommit = append(w.afterCommit, fn) }

// OnRollback schedules fn to run if the event's writes roll back (its
// savepoint, its group's transaction or its own), and never after a
// commit: the counterpart of AfterCommit, for giving back what the write
// reserved outside the database (the outbox hand-off's room).
func (w *Write) OnRollback(fn func()) { w.onRollback = append(w.onRollback, fn) }

// rolledBack runs the OnRollback steps once and forgets them.
func (w *Write) rolledBack() {
	for _, fn := range w.onRollback {
		fn()
	}
	w.onRollback = nil
}

// MembershipChanged marks that read access changed; access caches are
// dropped after commit.
func (w *Write) MembershipChanged() { w.membershipChanged = true }

// SideRows are written for every stored event that Needs them, whatever its
// kind, in the event's transaction after the kind's own Apply. Needs must be
// cheap: an event no SideRows need keeps the single-INSERT fast path.
// Relay-signed events stored with Write.Emit do not get them; those stored
// with Write.EmitWaking get the ones marked Wakes.
type SideRows struct {
	Needs func(ev *nostr.Event) bool
	Apply func(ctx context.Context, w *Write) error
	// Wakes marks side rows that tell the pubkeys an event p-tags about it
	// (mention rows, operator-listener outbox rows), so that a relay-signed
	// event meant to wake people reaches them by every path a user's
	// message would. Side rows that react to what an event says (workflow
	// triggers, say) stay unmarked: a relay-signed event must never fire them.
	Wakes bool
}

// Pipeline runs the write spine.
type Pipeline struct {
	pool          *pgxpool.Pool
	hub           *fanout.Hub
	handlers      map[int]Handler
	sideRows      []SideRows
	maxFutureSkew time.Duration
	clock         clock.Clock
	// maxMentions, maxThreadDepth and maxChannelMembers: see Options.
	maxMentions, maxThreadDepth, maxChannelMembers int
	// writeTimeout bounds one transaction of events: see Options.
	writeTimeout time.Duration

	// foldMembers and foldInterval: see Options.ListFoldMembers.
	foldMembers  int
	foldInterval time.Duration
	// onListClaimed runs in FoldChannelLists after a mark is claimed (tests).
	onListClaimed func()
	// onListsLocked runs in FoldChannelLists while it holds the channel's
	// row, before it writes the lists (tests).
	onListsLocked func()
	// onListFoldPass runs in RunListFolder after each pass (tests).
	onListFoldPass func()

	// groups commits concurrent events together; nil: each alone.
	groups *groupWriter
	// changeLines: each channel's changes that run alone, one at a time.
	changeLines changeLines

	keysMu sync.Mutex
	keys   map[uuid.UUID]*nostr.SecretKey // community relay keys

	// OnFanout observes every fan-out (metrics); may be nil.
	OnFanout func(fanout.Stats)
	// OnGroup observes every group of events written together, and every
	// event written alone as a group of one (metrics); may be nil. It runs
	// on the writing goroutine, before the group's events get their
	// answers, possibly on several goroutines at once: it must not block.
	OnGroup func(GroupStats)
	// OnChangeAlone is called for every change (an event that locks its
	// channel's row) the group writer hands on to run alone: its short
	// wait for a lock ran out, changes of its channel already wait alone,
	// or its group failed (metrics); may be nil.
	OnChangeAlone func()
	// OnMemberLimit is called when an event is refused because it would
	// add a member to a channel at its member limit (metrics); may be nil.
	OnMemberLimit func()
	// OnMembershipChange is called after a commit that changed who may read
	// what in a community; may be nil.
	OnMembershipChange func(community uuid.UUID)
	// OnPublish is called just before the local fan-out of every committed
	// (or relayed ephemeral) event, in commit order, with the readers
	// version its write read: the hook that carries it to the other relay
	// processes and tells the read routing of removals. May be nil.
	OnPublish func(community uuid.UUID, ev *nostr.Event, channel *uuid.UUID, readersVersion int64)
	// KeepEphemeral is called for an accepted ephemeral event before it is
	// relayed, to keep what must outlive the relay (presence); a
	// *Rejection it returns refuses the event, which is then not relayed.
	// May be nil.
	KeepEphemeral func(community uuid.UUID, ev *nostr.Event, channel *uuid.UUID) error
	// EphemeralSlot, when set, is waited for before an ephemeral event's
	// channel check, a statement on the pool outside the group writers:
	// any key may send typing and presence as fast as its rate allows, and
	// a fresh key gets a fresh rate. An error refuses the event as busy.
	EphemeralSlot func(ctx context.Context) (release func(), err error)
}

// Now is the pipeline clock's time (handlers compare expiries with it).
func (w *Write) Now() time.Time { return w.pipeline.clock.Now() }

// SQLNow is the now parameter of the write's queries (see package clock).
func (w *Write) SQLNow() *time.Time { return w.pipeline.clock.SQL() }

// Options are the pipeline's settings.
type Options struct {
	// MaxFutureSkew is how far ahead of now an event's created_at may be.
	MaxFutureSkew time.Duration
	// MaxMentions bounds the mention rows one event writes: its first
	// MaxMentions distinct p-tagged pubkeys (0: DefaultMaxMentions). The
	// event is stored whole; follow lists legitimately hold thousands of p
	// tags, and "#p" reads use the tag index, not mention rows.
	MaxMentions int
	// MaxThreadDepth bounds a channel reply's depth in its thread (0:
	// DefaultMaxThreadDepth); a deeper reply is refused with invalid:.
	// Each reply updates one row per ancestor under the thread's lock.
	MaxThreadDepth int
	// MaxChannelMembers bounds a channel's active members (0:
	// DefaultMaxChannelMembers): an add beyond it (a join, a put-user, a
	// removed member's return) is refused with restricted:, whichever
	// relay process writes it. A channel's lists, rewritten whole, and its
	// reader set cost in proportion to its members.
	MaxChannelMembers int
	// GroupMax bounds how many concurrent events commit in one transaction
	// (0: DefaultGroupMax; 1: every event in its own transaction, no group
	// writer). GroupWriters is how many groups may be written at once (a
	// second starts only when a whole group waits, and ends when less
	// than a whole group waits for it). GroupQueue is how many events may
	// wait for a group before new ones are refused (rate-limited:); a group
	// is never larger than the queue. GroupLockTimeout is how long an event
	// in a group may wait for a lock before it gives up its place and runs
	// in its own transaction. Zero values take the defaults.
	GroupMax, GroupWriters, GroupQueue int
	GroupLockTimeout                   time.Duration
	// WriteTimeout bounds one transaction that writes events, a group's or
	// an event's own (0: DefaultWriteTimeout). A statement on a stalled
	// server (a stopped backend, a connection a firewall dropped without a
	// word) otherwise never returns, and a group writer stuck on one holds
	// up every event queued behind it.
	WriteTimeout time.Duration
	// ListFoldMembers is the channel size (active members) from which a
	// membership change marks the channel's admins and members lists due
	// instead of writing them in its transaction (0:
	// DefaultListFoldMembers); ListFoldInterval is how long after its first
	// change a mark is due (0: DefaultListFoldInterval). See listfold.go.
	ListFoldMembers  int
	ListFoldInterval time.Duration
	// Clock tells the pipeline's time (zero value: the wall clock):
	// validation, the created_at of relay-signed events and the now of its
	// queries, so tests can drive time.
	Clock clock.Clock
}

// Defaults for Options left zero (the relay's configuration sets them).
const (
	DefaultMaxMentions    = 100
	DefaultMaxThreadDepth = 64
	// DefaultMaxChannelMembers keeps a channel's folded lists far inside
	// the write timeout: a fold was measured at up to about 90 µs a member,
	// 9 s at 100,000 (see docs/limits.md).
	DefaultMaxChannelMembers = 100_000
	DefaultWriteTimeout      = 30 * time.Second
)

// New returns a pipeline with the built-in kind handlers.
func New(pool *pgxpool.Pool, hub *fanout.Hub, opts Options) *Pipeline {
	if opts.MaxMentions <= 0 {
		opts.MaxMentions = DefaultMaxMentions
	}
	if opts.MaxThreadDepth <= 0 {
		opts.MaxThreadDepth = DefaultMaxThreadDepth
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = DefaultWriteTimeout
	}
	if opts.MaxChannelMembers <= 0 {
		opts.MaxChannelMembers = DefaultMaxChannelMembers
	}
	if opts.ListFoldMembers <= 0 {
		opts.ListFoldMembers = DefaultListFoldMembers
	}
	if opts.ListFoldInterval <= 0 {
		opts.ListFoldInterval = DefaultListFoldInterval
	}
	p := &Pipeline{
		pool:              pool,
		hub:               hub,
		maxMentions:       opts.MaxMentions,
		maxThreadDepth:    opts.MaxThreadDepth,
		maxChannelMembers: min(opts.MaxChannelMembers, math.MaxInt32),
		writeTimeout:      opts.WriteTimeout,
		foldMembers:       opts.ListFoldMembers,
		foldInterval:      opts.ListFoldInterval,
		maxFutureSkew:     opts.MaxFutureSkew,
		clock:             opts.Clock,
		keys:              map[uuid.UUID]*nostr.SecretKey{},
		handlers:          map[int]Handler{},
	}
	p.groups = newGroupWriter(p, opts)
	p.handlers[nostr.KindDeletion] = deletionHandler
	registerChannelHandlers(p.handlers)
	registerSocialHandlers(p)
	return p
}

// WaitingEvents is how many events wait for a group writer now.
func (p *Pipeline) WaitingEvents() int {
	if p.groups == nil {
		return 0
	}
	return p.groups.waitingEvents()
}

// Register adds or replaces the handler of a kind.
func (p *Pipeline) Register(kind int, h Handler) { p.handlers[kind] = h }

// RegisterSideRows adds side rows written for every stored event that needs them.
func (p *Pipeline) RegisterSideRows(s SideRows) { p.sideRows = append(p.sideRows, s) }

// sideRowsFor returns the side-row writers ev needs (usually none).
func (p *Pipeline) sideRowsFor(ev *nostr.Event) []SideRows {
	var out []SideRows
	for _, s := range p.sideRows {
		if s.Needs(ev) {
			out = append(out, s)
		}
	}
	return out
}

// handlerFor returns the kind's handler. Every event that names a channel
// (h tag) is bound to it and authorized, whatever its kind: a kind whose
// handler has no Prepare of its own (or no handler at all) gets the channel
// write check, so no kind can place an event in a channel's view unchecked.
func (p *Pipeline) handlerFor(ev *nostr.Event) Handler {
	h := p.handlers[ev.Kind]
	if h.Prepare == nil && ev.Tags.First("h") != nil {
		h.Prepare = resolveChannelForWrite
	}
	return h
}

// Submit runs one event, submitted by actor, through the write spine. It
// returns the outcome, a *Rejection for refused events, or another error for
// internal failures (which the caller reports as "error: ...").
func (p *Pipeline) Submit(ctx context.Context, tenant community.Tenant, actor string, ev *nostr.Event) (Outcome, error) {
	outcome, _, err := p.SubmitReply(ctx, tenant, actor, ev)
	return outcome, err
}

// SubmitReply is Submit that also returns the OK message to send: the
// handler's Reply for a stored event, else the outcome's Message.
func (p *Pipeline) SubmitReply(ctx context.Context, tenant community.Tenant, actor string, ev *nostr.Event) (Outcome, string, error) {
	outcome, reply, err := p.submit(ctx, tenant, actor, ev)
	if reply == "" {
		reply = outcome.Message()
	}
	return outcome, reply, err
}

func (p *Pipeline) submit(ctx context.Context, tenant community.Tenant, actor string, ev *nostr.Event) (Outcome, string, error) {
	if err := p.validate(actor, ev); err != nil {
		return 0, "", err
	}
	h := p.handlerFor(ev)
	if h.Validate != nil {
		if err := h.Validate(ev); err != nil {
			return 0, "", err
		}
	}
	w := &Write{Tenant: tenant, Event: ev, Actor: actor, pipeline: p}

	if nostr.IsEphemeral(ev.Kind) {
		if h.Prepare != nil {
			if err := p.prepareEphemeral(ctx, w, h); err != nil {
				return 0, "", err
			}
		}
		if err := checkChannelTags(w); err != nil {
			return 0, "", err
		}
		if p.KeepEphemeral != nil {
			if err := p.KeepEphemeral(tenant.ID(), ev, w.ChannelID); err != nil {
				return 0, "", err
			}
		}
		p.publish(w, ev, w.ChannelID)
		return Relayed, "", nil
	}

	j := &groupJob{ctx: ctx, w: w, h: h, sideRows: p.sideRowsFor(ev), locksChannelRow: changesChannel(ev.Kind) || h.LocksChannelRow, arrived: time.Now()}
	j.fast = h.Prepare == nil && h.Apply == nil && len(j.sideRows) == 0
	if p.groups != nil {
		if err := p.groups.submit(j); err != nil {
			return 0, "", err
		}
		if j.alone {
			// The group could not settle this event (a lock wait, a
			// deadlock with another group, or the group failed as a
			// whole): it runs in its own transaction, as if never grouped.
			j.reset()
			p.writeAlone(ctx, j)
		}
	} else {
		if j.locksChannelRow {
			p.changeLines.join(j, false)
		}
		p.writeAlone(ctx, j)
	}
	return p.finish(ctx, j)
}

// changeHandedOn counts a change the group writer handed on to run alone.
func (p *Pipeline) changeHandedOn() {
	if p.OnChangeAlone != nil {
		p.OnChangeAlone()
	}
}

// prepareEphemeral runs an ephemeral event's Prepare on the pool, in one of
// EphemeralSlot's slots when it is set.
func (p *Pipeline) prepareEphemeral(ctx context.Context, w *Write, h Handler) error {
	if p.EphemeralSlot != nil {
		release, err := p.EphemeralSlot(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return Reject("rate-limited", "the relay is busy; send it again shortly")
		}
		defer release()
	}
	w.Q = db.New(p.pool)
	return mapError(h.Prepare(ctx, w))
}

// writeAlone runs j in its own transaction and reports that to OnGroup as a
// group of one, so the groups observed are every transaction events commit
// in.
func (p *Pipeline) writeAlone(ctx context.Context, j *groupJob) {
	wctx, cancel := context.WithTimeout(ctx, p.writeTimeout)
	var stats GroupStats
	if j.turn != nil {
		// A change waits for its turn before it takes a connection; the
		// write's bound counts the wait, as it counted its wait for the
		// row when every change waited there. Deferred: a panicking
		// handler must not keep the turn from the changes behind it.
		defer p.changeLines.leave(j)
		j.err = p.changeLines.wait(wctx, j)
		// Its wait is the line's, a change that joined it at once
		// included: it never waited in a group.
		stats.Waited = time.Since(j.arrived)
	}
	start := time.Now()
	if j.err == nil {
		j.inserted, j.err = p.runAlone(wctx, j)
	}
	cancel()
	if p.OnGroup != nil {
		stats.Events, stats.Took = 1, time.Since(start)
		p.OnGroup(stats)
	}
}

// runAlone writes one event in its own transaction; the single INSERT alone
// when nothing needs a transaction around it.
func (p *Pipeline) runAlone(ctx context.Context, j *groupJob) (int64, error) {
	w := j.w
	if j.fast {
		// Nothing to authorize and no side rows: the INSERT alone is the
		// event's transaction. handlerFor gave every event with an h tag a
		// Prepare; checkChannelTags keeps this path honest if that changes.
		if err := checkChannelTags(w); err != nil {
			return 0, err
		}
		return p.insert(ctx, db.New(p.pool), w)
	}
	var inserted int64
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		var err error
		inserted, err = p.writeBody(ctx, db.New(tx), j)
		return err
	})
	return inserted, err
}

// writeBody is an event's part of a transaction: authorize, insert, then
// the kind's side rows. It returns the rows inserted (0 for a duplicate or
// a superseded version).
func (p *Pipeline) writeBody(ctx context.Context, q *db.Queries, j *groupJob) (int64, error) {
	w, h := j.w, j.h
	w.Q = q
	if h.Prepare != nil {
		if err := h.Prepare(ctx, w); err != nil {
			return 0, err
		}
	}
	if err := checkChannelTags(w); err != nil {
		return 0, err
	}
	if err := w.readChannelOnce(ctx, w.ChannelID); err != nil {
		return 0, err
	}
	inserted, err := p.insert(ctx, w.Q, w)
	if err != nil || inserted == 0 {
		return inserted, err
	}
	if h.Apply != nil {
		if err := h.Apply(ctx, w); err != nil {
			return 0, err
		}
	}
	for _, s := range j.sideRows {
		if err := s.Apply(ctx, w); err != nil {
			return 0, err
		}
	}
	return inserted, nil
}

// announceMembershipChanges runs OnMembershipChange for every community
// whose membership a committed group changed, once each, before any event
// of the group is answered and fanned out: each event is fanned out on its
// own goroutine, so a message committed after a removal in the same group
// could otherwise reach the removed member through readers cached before
// it (and miss a member the group added). finish then has nothing left to
// announce for these events.
func (p *Pipeline) announceMembershipChanges(group []*groupJob) {
	var announced []uuid.UUID
	for _, j := range group {
		w := j.w
		if !w.membershipChanged || j.alone || j.err != nil || j.inserted == 0 {
			continue
		}
		w.membershipChanged = false
		if id := w.Tenant.ID(); p.OnMembershipChange != nil && !slices.Contains(announced, id) {
			announced = append(announced, id)
			p.OnMembershipChange(id)
		}
	}
}

// finish answers an event once the transaction that held it is over, and
// runs its after-commit steps only if it was stored.
func (p *Pipeline) finish(ctx context.Context, j *groupJob) (Outcome, string, error) {
	w := j.w
	if j.err != nil {
		// Its own transaction rolled back (a refusal in a group already
		// ran these as its savepoint rolled back).
		w.rolledBack()
		err := mapError(j.err)
		if p.refusedButStored(ctx, w, err) {
			return Duplicate, "", nil
		}
		if IsMemberLimit(err) && p.OnMemberLimit != nil {
			p.OnMemberLimit()
		}
		return 0, "", err
	}
	if j.inserted == 0 {
		return p.notInserted(ctx, w.Tenant, w.Event)
	}
	// Committed: only now may anyone see it.
	if w.membershipChanged && p.OnMembershipChange != nil {
		p.OnMembershipChange(w.Tenant.ID())
	}
	p.publish(w, w.Event, w.ChannelID)
	for _, e := range w.emitted {
		p.publish(w, e.ev, e.channel)
	}
	w.onRollback = nil
	for _, fn := range w.afterCommit {
		fn()
	}
	return Stored, w.reply, nil
}

func (p *Pipeline) insert(ctx context.Context, q *db.Queries, w *Write) (int64, error) {
	params, err := eventstore.InsertParams(w.Tenant.ID(), w.Event, w.ChannelID)
	if err != nil {
		return 0, err
	}
	return q.EventInsert(ctx, params)
}

// refusedButStored reports whether an event refused by its checks is
// already stored: it committed earlier (a re-send, or the retry of a group
// whose COMMIT answer was lost) and its own write, or a group mate's,
// changed what the checks see (a leave whose member is gone, a message
// whose author a removal in the same group took out). Such an event is a
// duplicate, as NIP-01 answers a stored event sent again. Only the author
// learns this about their own event, and only a refusal pays the lookup.
func (p *Pipeline) refusedButStored(ctx context.Context, w *Write, err error) bool {
	var refused *Rejection
	if !errors.As(err, &refused) || refused.Prefix == "duplicate" || w.Event.PubKey != w.Actor {
		return false
	}
	stored, lookupErr := p.stored(ctx, w.Tenant, w.Event)
	return lookupErr == nil && stored
}

// stored reports whether ev is stored in tenant's community, hidden or not.
func (p *Pipeline) stored(ctx context.Context, tenant community.Tenant, ev *nostr.Event) (bool, error) {
	id := ev.IDBytes()
	return db.New(p.pool).EventExists(ctx, db.EventExistsParams{CommunityID: tenant.ID(), ID: id[:]})
}

// notInserted tells a duplicate from an event a trigger refused because its
// author deleted it (by id or by slot) or a newer version of its slot is
// stored. Both are accepted: when the lookup that tells them apart fails
// (the database went away after the insert), the event is still answered
// as accepted, in words that cover both, never as a failure its client
// would take for "not stored".
func (p *Pipeline) notInserted(ctx context.Context, tenant community.Tenant, ev *nostr.Event) (Outcome, string, error) {
	exists, err := p.stored(ctx, tenant, ev)
	switch {
	case err != nil:
		return Duplicate, storedOrSupersededReply, nil
	case exists:
		return Duplicate, "", nil
	}
	return Superseded, "", nil
}

// storedOrSupersededReply answers an event not inserted, duplicate or
// superseded, when the database could not say which.
const storedOrSupersededReply = "duplicate: this event, its deletion or a newer version of its address is already stored"

// versionOf is the readers version the write read for channel, 0 when it
// read none for that channel.
func (w *Write) versionOf(channel *uuid.UUID) int64 {
	if channel == nil {
		return 0
	}
	return w.readersVersions[*channel]
}

// ReadChannel records the channel access row (ChannelAccess) the write read
// in its transaction: every event the write stores in channel is fanned out
// from a reader set at least as new as that row's readers version. Every
// path that reads a channel's access row and then stores in that channel
// calls it; one that does not pays a second read of the row before storing
// (readChannelOnce).
func (w *Write) ReadChannel(channel uuid.UUID, access db.ChannelAccessRow) {
	if w.readersVersions == nil {
		w.readersVersions = map[uuid.UUID]int64{}
	}
	w.readersVersions[channel] = max(w.readersVersions[channel], access.ReadersVersion)
}

// readChannelOnce records the readers version of channel (nil: none) for
// a write about to store there without having read its access row, so that
// nothing it stores in a channel is fanned out from a reader set older than
// the write: a deletion by a former writer, a workflow's approval request.
// One indexed read, only for a channel this write has not read yet. A
// deleted channel has no row, and so no version to record.
func (w *Write) readChannelOnce(ctx context.Context, channel *uuid.UUID) error {
	if channel == nil {
		return nil
	}
	if _, read := w.readersVersions[*channel]; read {
		return nil
	}
	access, err := ChannelAccess(ctx, w.Q, db.ChannelAccessParams{CommunityID: w.Tenant.ID(), ID: *channel, Pubkey: w.ActorBytes()})
	if dberr.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	w.ReadChannel(*channel, access)
	return nil
}

// publish fans out ev, which w stored (or relayed) in channel, with the
// readers version w read for that channel.
func (p *Pipeline) publish(w *Write, ev *nostr.Event, channel *uuid.UUID) {
	readersVersion := w.versionOf(channel)
	// OnPublish first: it tells the read routing of a removal, and a local
	// subscriber sent the deletion could otherwise read the channel again
	// before the router knew, from a standby that has not replayed it.
	if p.OnPublish != nil {
		p.OnPublish(w.Tenant.ID(), ev, channel, readersVersion)
	}
	stats := p.hub.PublishWritten(w.Tenant.ID(), ev, channel, readersVersion)
	if p.OnFanout != nil {
		p.OnFanout(stats)
	}
}

// checkChannelTags makes every h tag name the channel the event was bound
// to (after Prepare authorized it). Otherwise a second h tag, or an h tag on
// a kind that binds no channel, would make an event look like part of a
// private channel whose members never let its author in.
func checkChannelTags(w *Write) error {
	for _, tag := range w.Event.Tags {
		if len(tag) < 2 || tag[0] != "h" {
			continue
		}
		if w.ChannelID == nil {
			return Reject("invalid", "kind %d cannot carry an h tag", w.Event.Kind)
		}
		if tag[1] != w.ChannelID.String() {
			return Reject("invalid", "every h tag must name the event's channel %s", w.ChannelID)
		}
	}
	return nil
}

// mapError turns what the database refused into rejections the client can
// act on, with the fixed text of the rule that was broken (never the
// server's own message); anything else stays internal.
func mapError(err error) error {
	err = dberr.Interpret(err)
	if v, ok := dberr.AsViolation(err); ok {
		switch {
		case v.Kind == dberr.Unique:
			return Reject("duplicate", "%s", v.ClientText)
		case v.Constraint == "channel_members_keep_an_owner":
			return Reject("restricted", "%s", v.ClientText)
		case v.Constraint == "events_moderation_deleted_before_arrival":
			// The author's retraction stands, whoever replays the event.
			return Reject("blocked", "%s", v.ClientText)
		}
		return Reject("invalid", "%s", v.ClientText)
	}
	if errors.Is(err, dberr.ErrSerialization) {
		return Reject("error", "the write collided with a concurrent one; send it again")
	}
	if errors.Is(err, dberr.ErrCommunityWriteFenced) {
		return ErrCommunityBeingDeleted()
	}
	return err
}

// validate holds the rules every event must pass whatever its kind.
func (p *Pipeline) validate(actor string, ev *nostr.Event) error {
	if err := ev.Verify(); err != nil {
		if errors.Is(err, nostr.ErrBadID) {
			return Reject("invalid", "event id does not match its content")
		}
		return Reject("invalid", "%v", err)
	}
	if ev.PubKey != actor && ev.Kind != nostr.KindGiftWrap {
		return Reject("restricted", "event pubkey must match the authenticated pubkey")
	}
	switch ev.Kind {
	case nostr.KindAuth:
		return Reject("invalid", "kind 22242 is only accepted in an AUTH message")
	case nostr.KindBlossomAuth, nostr.KindHTTPAuth:
		// A credential, ephemeral by kind: relayed, it would hand every live
		// subscriber a token for the author's blobs or HTTP calls.
		return Reject("invalid", "kind %d is an HTTP authorization: send it in an Authorization header, never as an event", ev.Kind)
	}
	if ev.Kind == presence.Kind {
		if size := len(ev.AppendJSON(nil)); size > presence.MaxAnnouncementBytes {
			return Reject("invalid", "a presence announcement is at most %d bytes; this one is %d", presence.MaxAnnouncementBytes, size)
		}
	}
	// A deletion names a slot by its coordinate, which is bounded (the tag
	// index holds it); a longer d tag made a slot no deletion could name,
	// and beyond about 2,700 bytes the address index refused the row, an
	// internal error the client was told to retry.
	if nostr.IsAddressable(ev.Kind) {
		if c := (nostr.Coordinate{Kind: ev.Kind, PubKey: ev.PubKey, D: ev.DTag()}); len(c.String()) > nostr.MaxCoordinateLen {
			return Reject("invalid", "d tag too long: the event's coordinate <kind>:<pubkey>:<d> must be at most %d bytes, so that a deletion can name it", nostr.MaxCoordinateLen)
		}
	}
	if limit := p.clock.Now().Add(p.maxFutureSkew).Unix(); ev.CreatedAt > limit {
		return Reject("invalid", "created_at is more than %s in the future", p.maxFutureSkew)
	}
	// NIP-40: an event already expired is never stored nor relayed.
	if at, ok, err := ev.Expiration(); err != nil {
		return Reject("invalid", "%v", err)
	} else if ok && at <= p.clock.Now().Unix() {
		return Reject("invalid", "the event expired at %d (NIP-40)", at)
	}
	// PostgreSQL text and jsonb cannot hold NUL; refuse it rather than fail the insert.
	if strings.IndexByte(ev.Content, 0) >= 0 {
		return Reject("invalid", "content must not contain NUL characters")
	}
	for _, tag := range ev.Tags {
		for _, v := range tag {
			if strings.IndexByte(v, 0) >= 0 {
				return Reject("invalid", "tags must not contain NUL characters")
			}
		}
	}
	return nil
}
