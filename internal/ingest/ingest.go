// Package ingest is the write spine: one path for every accepted event,
// whichever transport brought it. verify → per-kind validation → one
// transaction (the event row, then the kind's side rows) → commit → only
// then fan-out. A rollback leaves no side effect at all.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// Outcome says what happened to an event that was not rejected.
type Outcome int

const (
	Stored     Outcome = iota // inserted and fanned out
	Duplicate                 // already stored in this community
	Superseded                // a newer version of its slot, or the slot's deletion, is stored
	Relayed                   // ephemeral: fanned out, never stored
)

// Message is the OK message text for an accepted outcome.
func (o Outcome) Message() string {
	switch o {
	case Duplicate:
		return "duplicate: already have this event"
	case Superseded:
		return "duplicate: a newer version of this address, or its deletion, is already stored"
	}
	return ""
}

// Rejection is a refusal with a NIP-01 machine-readable prefix.
type Rejection struct {
	Prefix string // invalid, restricted, blocked, rate-limited, error ...
	Reason string
}

func (r *Rejection) Error() string { return r.Prefix + ": " + r.Reason }

// Reject builds a *Rejection.
func Reject(prefix, format string, args ...any) error {
	return &Rejection{Prefix: prefix, Reason: fmt.Sprintf(format, args...)}
}

// Handler is the kind-specific part of ingest. Validate runs before any
// database work; Apply runs inside the event's transaction, after its row
// was inserted, and writes the kind's side rows.
type Handler interface {
	Validate(ev *nostr.Event) error
	Apply(ctx context.Context, q *db.Queries, tenant community.Tenant, ev *nostr.Event) error
}

// Pipeline runs the write spine.
type Pipeline struct {
	pool          *pgxpool.Pool
	hub           *fanout.Hub
	handlers      map[int]Handler
	maxFutureSkew time.Duration
	now           func() time.Time
	// OnFanout observes every fan-out (metrics); may be nil.
	OnFanout func(fanout.Stats)
}

// New returns a pipeline with the built-in kind handlers.
func New(pool *pgxpool.Pool, hub *fanout.Hub, maxFutureSkew time.Duration) *Pipeline {
	return &Pipeline{
		pool:          pool,
		hub:           hub,
		maxFutureSkew: maxFutureSkew,
		now:           time.Now,
		handlers: map[int]Handler{
			nostr.KindDeletion: deletionHandler{},
		},
	}
}

// Submit runs one event through the write spine. It returns the outcome, a
// *Rejection for refused events, or another error for internal failures
// (which the caller reports as "error: ...").
func (p *Pipeline) Submit(ctx context.Context, tenant community.Tenant, ev *nostr.Event) (Outcome, error) {
	if err := p.validate(ev); err != nil {
		return 0, err
	}
	handler := p.handlers[ev.Kind]
	if handler != nil {
		if err := handler.Validate(ev); err != nil {
			return 0, err
		}
	}
	if nostr.IsEphemeral(ev.Kind) {
		p.publish(tenant, ev)
		return Relayed, nil
	}
	params, err := eventstore.InsertParams(tenant.ID(), ev, nil)
	if err != nil {
		return 0, err
	}

	var inserted int64
	if handler == nil {
		// No side rows: the INSERT alone is the event's transaction.
		inserted, err = db.New(p.pool).EventInsert(ctx, params)
	} else {
		err = pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
			q := db.New(tx)
			if inserted, err = q.EventInsert(ctx, params); err != nil || inserted == 0 {
				return err
			}
			return handler.Apply(ctx, q, tenant, ev)
		})
	}
	if err != nil {
		return 0, err
	}
	if inserted == 0 {
		return p.notInserted(ctx, tenant, params)
	}
	p.publish(tenant, ev)
	return Stored, nil
}

// notInserted tells a duplicate from an event the replaceable-slot trigger
// refused because a newer version is stored.
func (p *Pipeline) notInserted(ctx context.Context, tenant community.Tenant, params db.EventInsertParams) (Outcome, error) {
	exists, err := db.New(p.pool).EventExists(ctx, db.EventExistsParams{CommunityID: tenant.ID(), ID: params.ID})
	if err != nil {
		return 0, err
	}
	if exists {
		return Duplicate, nil
	}
	return Superseded, nil
}

func (p *Pipeline) publish(tenant community.Tenant, ev *nostr.Event) {
	stats := p.hub.Publish(tenant.ID(), ev, nil)
	if p.OnFanout != nil {
		p.OnFanout(stats)
	}
}

// validate holds the rules every event must pass whatever its kind.
func (p *Pipeline) validate(ev *nostr.Event) error {
	if err := ev.Verify(); err != nil {
		if errors.Is(err, nostr.ErrBadID) {
			return Reject("invalid", "event id does not match its content")
		}
		return Reject("invalid", "%v", err)
	}
	if ev.Kind == nostr.KindAuth {
		return Reject("invalid", "kind 22242 is only accepted in an AUTH message")
	}
	if limit := p.now().Add(p.maxFutureSkew).Unix(); ev.CreatedAt > limit {
		return Reject("invalid", "created_at is more than %s in the future", p.maxFutureSkew)
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
