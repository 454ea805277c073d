package outbox

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// RegistrationPath is where RegistrationHandler is mounted.
const RegistrationPath = "/operator/listener/pubkeys"

const (
	maxRegistrationTargets = 1000
	// maxRegistrationBody fits 1000 quoted 64-hex keys with generous spacing.
	maxRegistrationBody = 256 << 10
	// replayTTL keeps an auth event's claim while it can still pass the
	// ±60 s created_at check, plus 60 s for clock skew between pods and the
	// database.
	replayTTL = 2 * time.Minute
)

// NIP98Verifier checks a request's NIP-98 Authorization header: a valid
// kind-27235 event within the relay's time window whose u tag is
// expectedURL, whose method tag is the request method, and whose payload
// tag is present and is the SHA-256 of body. It returns the verified auth
// event, or an error whose text is sent back with 401 after "NIP-98: ".
// Replay protection is the handler's job. A *RateLimitedError is answered
// 429 instead.
type NIP98Verifier func(r *http.Request, body []byte, expectedURL string) (*nostr.Event, error)

// RateLimitedError is a verifier's refusal to check a signature now (the
// client's address sent too many bad ones): answered 429 with Retry-After
// and Reason, which starts with "rate-limited: ".
type RateLimitedError struct {
	Reason     string
	RetryAfter time.Duration
}

func (e *RateLimitedError) Error() string { return e.Reason }

// DatabaseFailure answers a request whose statement what failed with err,
// as the relay answers every route's: 503 with Retry-After, the outage
// logged once, while the database cannot be reached; 503 with err logged
// otherwise.
type DatabaseFailure func(w http.ResponseWriter, r *http.Request, err error, what string)

// RegistrationHandler serves POST (register) and DELETE (remove) of
// {"pubkeys": [<64-hex>, ...]} for the signing listener. origin is
// Config.APIOrigin; routes are the configured listeners, the only keys
// allowed to register. failed answers a database failure. now (at most
// one; default the wall clock) dates the registrations.
func RegistrationHandler(pool *pgxpool.Pool, routes Routes, origin string, verify NIP98Verifier, failed DatabaseFailure, now ...clock.Clock) http.Handler {
	q := db.New(pool)
	var registeredAt clock.Clock
	if len(now) > 0 {
		registeredAt = now[0]
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost && r.Method != http.MethodDelete {
			w.Header().Set("Allow", "POST, DELETE")
			writeError(w, http.StatusMethodNotAllowed, "invalid: method must be POST or DELETE")
			return
		}
		if origin == "" {
			writeError(w, http.StatusInternalServerError, "error: operator API origin is not configured")
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRegistrationBody))
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, http.StatusRequestEntityTooLarge, "invalid: request body too large")
			return
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid: could not read the request body")
			return
		}
		auth, err := verify(r, body, origin+RegistrationPath)
		var limited *RateLimitedError
		if errors.As(err, &limited) {
			w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(limited.RetryAfter.Seconds())), 10))
			writeError(w, http.StatusTooManyRequests, limited.Reason)
			return
		}
		if err != nil {
			unauthorized(w, "NIP-98: "+err.Error())
			return
		}
		// Only configured listeners get as far as the replay store, so a
		// stranger's valid signatures cannot fill it.
		signer := auth.PubKey
		if _, ok := routes[signer]; !ok {
			writeError(w, http.StatusForbidden, "restricted: actor not authorized: not a configured operator listener")
			return
		}
		fresh, err := claimAuthEvent(r.Context(), q, auth)
		if err != nil {
			failed(w, r, err, "operator auth replay claim")
			return
		}
		if !fresh {
			// Identical requests signed in one second are one event (one id).
			unauthorized(w, "NIP-98: replay detected (sign each request anew, with a nonce tag or a later created_at)")
			return
		}
		targets, msg := parseTargets(body)
		if msg != "" {
			writeError(w, http.StatusBadRequest, msg)
			return
		}
		listener, _ := hex.DecodeString(signer)
		if r.Method == http.MethodPost {
			_, err = q.ListenerRegistrationsUpsert(r.Context(), db.ListenerRegistrationsUpsertParams{Listener: listener, Targets: targets, Now: registeredAt.SQL()})
		} else {
			_, err = RemoveTargets(r.Context(), pool, listener, targets)
		}
		if err != nil {
			failed(w, r, err, "listener registration")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "{}")
	})
}

// RemoveTargets removes listener's registrations of targets and, in the
// same transaction, its queued notifications about them: the listener asked
// not to be told any more. A row a worker is sending now is held by its
// claim and finishes as claimed. It returns how many registrations it
// removed. The registration API and buzz-admin both remove through it.
func RemoveTargets(ctx context.Context, conn interface {
	Begin(context.Context) (pgx.Tx, error)
}, listener []byte, targets [][]byte) (removed int64, err error) {
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		q := db.New(tx)
		if _, err := q.OutboxDeleteUnsentForTargets(ctx, db.OutboxDeleteUnsentForTargetsParams{Listener: listener, Targets: targets}); err != nil {
			return err
		}
		removed, err = q.ListenerRegistrationsDelete(ctx, db.ListenerRegistrationsDeleteParams{Listener: listener, Targets: targets})
		return err
	})
	return removed, err
}

// claimAuthEvent marks the verified auth event as used (replay store scope
// "operator-management"): fresh is false for a second use (refused 401).
// While the store cannot answer (err), the request is refused too (fail
// closed, but as a database failure, 503: the signature was good, and a
// listener told 401 would take its key or clock for the fault and may not
// retry).
func claimAuthEvent(ctx context.Context, q *db.Queries, ev *nostr.Event) (fresh bool, err error) {
	id := ev.IDBytes()
	n, err := q.OperatorAuthReplayClaim(ctx, db.OperatorAuthReplayClaimParams{
		EventID: id[:], ExpiresAt: time.Unix(ev.CreatedAt, 0).Add(replayTTL),
	})
	return n > 0, err
}

// parseTargets returns the distinct target keys of a registration body, or
// the 400 message.
func parseTargets(body []byte) ([][]byte, string) {
	var req struct {
		Pubkeys []string `json:"pubkeys"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, "invalid: operator-listener pubkeys JSON: " + err.Error()
	}
	if n := len(req.Pubkeys); n < 1 || n > maxRegistrationTargets {
		return nil, "invalid: pubkeys must contain between 1 and 1000 entries"
	}
	targets := make([][]byte, 0, len(req.Pubkeys))
	seen := make(map[string]struct{}, len(req.Pubkeys))
	for _, p := range req.Pubkeys {
		b, err := hex.DecodeString(p)
		if err != nil || len(b) != 32 {
			return nil, "invalid: pubkeys must contain 64-char hex public keys"
		}
		if _, dup := seen[string(b)]; !dup {
			seen[string(b)] = struct{}{}
			targets = append(targets, b)
		}
	}
	return targets, ""
}

// unauthorized answers a NIP-98 failure: 401 with the challenge a 401 must
// carry (RFC 9110) and the auth-required: prefix, as the HTTP bridge answers.
func unauthorized(w http.ResponseWriter, msg string) {
	w.Header().Set("WWW-Authenticate", "Nostr")
	writeError(w, http.StatusUnauthorized, "auth-required: "+msg)
}

// writeError answers msg, which starts with its NIP-01 prefix (invalid:,
// auth-required:, restricted:, rate-limited:, error:) like every HTTP error answer.
func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}
