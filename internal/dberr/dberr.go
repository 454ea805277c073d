// Package dberr is the one place that reads PostgreSQL errors. It sits
// beside the generated internal/db: callers pass whatever a query returned
// through Interpret and test the result with errors.Is / errors.As against
// the values here, never against SQLSTATE strings or server messages.
// Constraint violations are recognized by constraint name, each with a
// fixed text a client may see; the server's own message never leaves the
// process (it can quote values and internal names).
package dberr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Conditions a caller may act on. Interpret wraps the driver's error, so
// errors.Is(err, ErrNotFound) holds for the result and the original stays
// reachable for logs.
var (
	// ErrNotFound: a query that returns one row found none.
	ErrNotFound = errors.New("not found")
	// ErrSerialization: the transaction lost a serialization conflict or a
	// deadlock (40001, 40P01); running it again may succeed.
	ErrSerialization = errors.New("serialization failure")
	// ErrNotInPrerequisiteState: an object was not in the state the
	// statement needs (55000 other than the write fence), or a lock was not
	// available (55P03: lock_timeout).
	ErrNotInPrerequisiteState = errors.New("object not in prerequisite state")
	// ErrCommunityWriteFenced: the community's deletion fence refused the
	// write (55000 naming the rule community_write_fence). The community is
	// going away: running the write again cannot succeed.
	ErrCommunityWriteFenced = errors.New("community write fenced")
	// ErrInvalidTransactionState: the statement cannot run in this
	// transaction's state (class 25: aborted, read-only, ...).
	ErrInvalidTransactionState = errors.New("invalid transaction state")
	// ErrQueryCanceled: the statement was cancelled, e.g. by
	// statement_timeout (57014).
	ErrQueryCanceled = errors.New("query canceled")
	// ErrDeletionLeaseLost: a community deletion step ran under a lease
	// this executor no longer holds (BZ001); its successor owns the request.
	ErrDeletionLeaseLost = errors.New("deletion lease lost")
	// ErrDeletionSafety: a community deletion rule refused the step (BZ002,
	// or 23000 from the deletion guards); retrying cannot help.
	ErrDeletionSafety = errors.New("deletion safety rule")
	// ErrServingWritesNotDrained: a deletion waits for live serving-write
	// leases of the community (BZ003); a later attempt may pass.
	ErrServingWritesNotDrained = errors.New("serving writes not drained")
)

// CommunityWriteFence names the deletion fence's refusals (migration 051):
// the fence raises 55000, which other states share, so its name is what
// tells it apart.
const CommunityWriteFence = "community_write_fence"

// UnavailableAnswer is the answer, over HTTP, to a request the database
// could not serve (whatever the cause, which is logged, never shown): it
// may be sent again, with a new NIP-98 header if it carried one (a claim
// made before the failure may stand). Nothing changed, or (an event whose
// COMMIT lost its answer as the database went away) the event was stored,
// and is answered as a duplicate when sent again. The relay's routes and
// the workflow webhooks answer the same text.
const UnavailableAnswer = "error: database unavailable; try again"

// ViolationKind says which sort of constraint a violation broke.
type ViolationKind int

const (
	Unique     ViolationKind = iota + 1 // 23505
	Check                               // 23514, including triggers that raise it
	ForeignKey                          // 23503
	NotNull                             // 23502
	Exclusion                           // 23P01
)

// Violation is a broken constraint, recognized by name.
type Violation struct {
	Kind       ViolationKind
	Constraint string // the constraint (or the trigger that stands for one)
	// ClientText is safe to show a client: fixed per constraint.
	ClientText string
	err        error
}

func (v *Violation) Error() string {
	return fmt.Sprintf("constraint %s violated: %v", v.Constraint, v.err)
}

func (v *Violation) Unwrap() error { return v.err }

// clientTexts are the client-facing texts of the constraints a client's
// input can break. A constraint missing here gets a generic text naming it.
var clientTexts = map[string]string{
	"channel_members_keep_an_owner":            "a channel must keep an owner: make someone else owner first",
	"channels_community_id_immutable":          "a channel cannot move to another community",
	"channels_name_not_blank":                  "a channel name must not be blank",
	"channels_pkey":                            "that channel id is taken",
	"communities_host_key":                     "that host is already taken",
	"events_created_at_floor":                  "a channel event's created_at is too far in the past to store; sign it again with the current time",
	"events_deletion_coordinates_canonical":    "an a tag must be a canonical coordinate <kind>:<lowercase hex pubkey>:<d tag>",
	"events_never_ephemeral":                   "ephemeral kinds are never stored",
	"events_d_tag_iff_addressable":             "only addressable kinds carry a stored d tag",
	"events_kind_range":                        "kind must be between 0 and 65535",
	"events_moderation_deleted_before_arrival": "its author deleted this event before it arrived here, so it is not applied",
	"events_moderation_never_expires":          "a channel's moderation events (9000-9002, 9005, 9007, 9008) are its lasting account of who did what: they cannot carry an expiration tag",
}

// ClientText returns the fixed client-facing text for constraint.
func ClientText(constraint string) string {
	if text, ok := clientTexts[constraint]; ok {
		return text
	}
	return "the database refused the write (rule " + constraint + ")"
}

var violationKinds = map[string]ViolationKind{
	"23505": Unique, "23514": Check, "23503": ForeignKey, "23502": NotNull, "23P01": Exclusion,
}

// Interpret maps a database error onto this package's values: ErrNotFound
// for pgx.ErrNoRows, a *Violation for constraint violations, the sentinel
// errors above for their SQLSTATEs. Anything else comes back unchanged, as
// does nil.
func Interpret(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	if kind, ok := violationKinds[pgErr.Code]; ok {
		return &Violation{Kind: kind, Constraint: pgErr.ConstraintName, ClientText: ClientText(pgErr.ConstraintName), err: err}
	}
	var sentinel error
	switch {
	case pgErr.Code == "40001" || pgErr.Code == "40P01":
		sentinel = ErrSerialization
	case pgErr.Code == "55000" && pgErr.ConstraintName == CommunityWriteFence:
		sentinel = ErrCommunityWriteFenced
	case pgErr.Code == "55000" || pgErr.Code == "55P03":
		sentinel = ErrNotInPrerequisiteState
	case len(pgErr.Code) == 5 && pgErr.Code[:2] == "25":
		sentinel = ErrInvalidTransactionState
	case pgErr.Code == "57014":
		sentinel = ErrQueryCanceled
	case pgErr.Code == "BZ001":
		sentinel = ErrDeletionLeaseLost
	case pgErr.Code == "BZ002" || pgErr.Code == "23000":
		sentinel = ErrDeletionSafety
	case pgErr.Code == "BZ003":
		sentinel = ErrServingWritesNotDrained
	default:
		return err
	}
	return fmt.Errorf("%w: %w", sentinel, err)
}

// IsNotFound reports whether err means "no row" (before or after Interpret).
func IsNotFound(err error) bool {
	return errors.Is(err, ErrNotFound) || errors.Is(err, pgx.ErrNoRows)
}

// IsLockTimeout reports whether err is a lock wait cut short by
// lock_timeout (55P03), before or after Interpret.
func IsLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// IsTransient reports whether a transaction that failed with err may
// succeed if run again from its start: it lost a serialization conflict or
// a deadlock (40001, 40P01), the server ended or refused its session
// (57P01 admin shutdown, 57P02 crash shutdown, 57P03 cannot connect now,
// 57P05 idle session timeout, 53300 too many connections,
// class 08 connection exceptions but 08P01, a protocol violation), or the
// connection failed under it (a network error, an early end of stream, a
// connection pgx closed under it, or a statement pgx never sent). A COMMIT whose answer was lost may have
// committed: run again only a transaction that is idempotent or fenced.
// A context's cancellation or deadline is never transient: the caller
// chose to stop.
func IsTransient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", "40P01", "53300", "57P01", "57P02", "57P03", "57P05":
			return true
		case "08P01":
			// protocol_violation: what the client sent, which it would
			// send again.
			return false
		}
		return strings.HasPrefix(pgErr.Code, "08")
	}
	var netErr net.Error
	return pgconn.SafeToRetry(err) || errors.Is(err, pgconn.ErrConnClosed) || errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// IsUnreachable reports whether err means the database could not be
// reached rather than that it refused the work: a connection that could
// not be made or was lost, the server shutting down, starting up or out of
// connection slots. Every request fails the same way until it is back, so
// such a failure is an outage to report once, not a fault of the request.
//
// A server that refused the relay's login (class 28: a wrong password, no
// pg_hba.conf entry for it, a role that may not log in) is reached, and
// refuses: a configuration error that no wait ends, to be logged as what
// it is each time, never as an outage whose one line says the database is
// unreachable and which no ping would ever end. A session the server ended
// (57P01, one backend terminated or the server shutting down: the same
// SQLSTATE) stays an outage to retry: which of the two it was, the outage
// log's next ping tells, a second later.
func IsUnreachable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01" || pgErr.Code == "57P05" || IsLoginRefused(err)) {
		return false
	}
	var connectErr *pgconn.ConnectError
	return errors.As(err, &connectErr) || IsTransient(err)
}

// IsLoginRefused reports whether the server refused the relay's login
// (SQLSTATE class 28, invalid authorization: a wrong password, no
// pg_hba.conf entry, a role without LOGIN): the database URL's user or
// password is wrong, or the server's access rules, and no retry helps.
func IsLoginRefused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "28")
}

// AsViolation returns the constraint violation err holds, if any.
func AsViolation(err error) (*Violation, bool) {
	var v *Violation
	if errors.As(err, &v) {
		return v, true
	}
	if v, ok := Interpret(err).(*Violation); ok {
		return v, true
	}
	return nil, false
}
