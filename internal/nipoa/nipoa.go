// Package nipoa parses and verifies owner attestations: the NIP-OA `auth`
// tag, ["auth", <owner pubkey>, <conditions>, <sig>], by which an owner key
// authorizes an agent key. The owner signs (BIP-340) the SHA-256 of
// "nostr:agent-auth:" + <agent pubkey hex> + ":" + <conditions>, so a valid
// tag proves the owner vouched for that agent key, under those conditions.
//
// Errors wrap ErrMalformed (the tag does not follow the grammar) or
// ErrRejected (well formed, but it does not authorize this agent for this
// event), so an HTTP caller can answer 400 or 401.
package nipoa

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// TagName names the attestation tag.
const TagName = "auth"

// domain separates attestation signatures from every other use of the
// owner key.
const domain = "nostr:agent-auth:"

// Range limits of the condition values.
const (
	maxKind      = 65535
	maxTimestamp = 4294967295
)

var (
	// ErrMalformed: the tag, its owner, signature or conditions do not
	// follow the grammar.
	ErrMalformed = errors.New("malformed auth tag")
	// ErrRejected: the tag is well formed but does not authorize this agent
	// key for this event (self-attestation, bad signature, unmet condition).
	ErrRejected = errors.New("auth tag rejected")
)

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}

func rejected(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrRejected}, args...)...)
}

// clauseField is what a condition clause constrains.
type clauseField uint8

const (
	kindEquals clauseField = iota + 1
	createdBefore
	createdAfter
)

type clause struct {
	field clauseField
	value int64
}

// Attestation is a parsed auth tag. Conditions is kept exactly as sent: it is
// part of the signed message, so it is never reordered or normalized.
type Attestation struct {
	Owner      string // 64 lowercase hex, x-only
	Conditions string
	Sig        string // 128 lowercase hex
	owner      [32]byte
	sig        [64]byte
	clauses    []clause
}

// Parse checks an auth tag's shape and grammar; it does not verify the
// signature (see VerifyFor and VerifyEvent).
func Parse(tag []string) (*Attestation, error) {
	if len(tag) != 4 {
		return nil, malformed("must have exactly 4 elements [\"auth\", owner, conditions, sig], got %d", len(tag))
	}
	if tag[0] != TagName {
		return nil, malformed("first element must be %q", TagName)
	}
	a := &Attestation{Owner: tag[1], Conditions: tag[2], Sig: tag[3]}
	var ok bool
	if a.owner, ok = nostr.DecodeHex32(tag[1]); !ok {
		return nil, malformed("owner must be a 64-char lowercase hex pubkey")
	}
	if !nostr.IsLowerHex(tag[3], 128) {
		return nil, malformed("sig must be 128-char lowercase hex")
	}
	_, _ = hex.Decode(a.sig[:], []byte(tag[3]))
	clauses, err := parseConditions(tag[2])
	if err != nil {
		return nil, err
	}
	a.clauses = clauses
	return a, nil
}

// ParseHeader parses the x-auth-tag HTTP header: the tag as a raw JSON array
// of strings.
func ParseHeader(value string) (*Attestation, error) {
	var tag []string
	if err := json.Unmarshal([]byte(value), &tag); err != nil {
		return nil, malformed("must be a JSON array of strings [\"auth\", owner, conditions, sig]")
	}
	return Parse(tag)
}

// Find returns the event's auth tag, parsed, or nil when it has none. An
// event with more than one auth tag has no valid one.
func Find(tags nostr.Tags) (*Attestation, error) {
	var found nostr.Tag
	n := 0
	for _, t := range tags {
		if len(t) > 0 && t[0] == TagName {
			found = t
			n++
		}
	}
	switch n {
	case 0:
		return nil, nil
	case 1:
		return Parse(found)
	}
	return nil, malformed("an event may carry at most one auth tag, this one has %d", n)
}

// parseConditions reads "" or clause("&"clause)*, each clause kind=<n>,
// created_at<<t> or created_at><t>, numbers in canonical decimal.
func parseConditions(s string) ([]clause, error) {
	if s == "" {
		return nil, nil
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f {
			return nil, malformed("conditions must be printable ASCII without whitespace")
		}
	}
	parts := strings.Split(s, "&")
	out := make([]clause, 0, len(parts))
	for _, part := range parts {
		if part == "" {
			return nil, malformed("conditions have an empty clause (a leading, trailing or doubled &)")
		}
		var c clause
		var digits string
		var limit int64
		switch {
		case strings.HasPrefix(part, "kind="):
			c.field, digits, limit = kindEquals, part[len("kind="):], maxKind
		case strings.HasPrefix(part, "created_at<"):
			c.field, digits, limit = createdBefore, part[len("created_at<"):], maxTimestamp
		case strings.HasPrefix(part, "created_at>"):
			c.field, digits, limit = createdAfter, part[len("created_at>"):], maxTimestamp
		default:
			return nil, malformed("unknown condition clause %.40q (only kind=, created_at< and created_at>)", part)
		}
		v, ok := canonicalDecimal(digits, limit)
		if !ok {
			return nil, malformed("clause %.40q needs a canonical decimal from 0 to %d (no sign, no leading zero)", part, limit)
		}
		c.value = v
		out = append(out, c)
	}
	return out, nil
}

// canonicalDecimal parses digits only, without a leading zero (except "0"
// itself), up to limit.
func canonicalDecimal(s string, limit int64) (int64, bool) {
	if s == "" || len(s) > 10 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v > limit {
		return 0, false
	}
	return v, true
}

// Digest is the signed message for agent: SHA-256 of the preimage.
func Digest(agent, conditions string) [32]byte {
	return sha256.Sum256([]byte(domain + agent + ":" + conditions))
}

// verifySignature checks that the owner, a key other than agent, signed
// this tag for agent.
func (a *Attestation) verifySignature(agent string) error {
	if a.Owner == agent {
		return rejected("the owner must not be the agent itself (self-attestation)")
	}
	if err := nostr.VerifyDigest(a.owner, Digest(agent, a.Conditions), a.sig); err != nil {
		return rejected("the owner's signature does not authorize agent %s under these conditions", agent)
	}
	return nil
}

// Allows reports whether an event of kind, created at createdAt, meets every
// condition.
func (a *Attestation) Allows(kind int, createdAt int64) error {
	for _, c := range a.clauses {
		if c.field == kindEquals && int64(kind) != c.value {
			return rejected("condition kind=%d does not allow kind %d", c.value, kind)
		}
	}
	return a.allowsAt(createdAt)
}

func (a *Attestation) allowsAt(createdAt int64) error {
	for _, c := range a.clauses {
		switch {
		case c.field == createdBefore && !(createdAt < c.value):
			return rejected("condition created_at<%d does not allow created_at %d", c.value, createdAt)
		case c.field == createdAfter && !(createdAt > c.value):
			return rejected("condition created_at>%d does not allow created_at %d", c.value, createdAt)
		}
	}
	return nil
}

// Until is when the attestation ends: its earliest created_at< bound (an
// event created then or later is not the owner's to vouch for), and
// whether it has one.
func (a *Attestation) Until() (int64, bool) {
	until, bounded := int64(0), false
	for _, c := range a.clauses {
		if c.field == createdBefore && (!bounded || c.value < until) {
			until, bounded = c.value, true
		}
	}
	return until, bounded
}

// VerifyFor verifies the tag as the owner attestation of an authenticating
// agent (a NIP-42 AUTH or NIP-98 event signed by agent at createdAt): the
// signature, and the created_at conditions against that event. kind=
// clauses limit which events the agent may publish under the attestation;
// an authentication event is not one of them, and evaluating kind= against
// it would make any kind-limited attestation unusable for authenticating
// (and one tag could never serve both AUTH and HTTP), so they are checked
// for grammar only.
func (a *Attestation) VerifyFor(agent string, createdAt int64) error {
	if err := a.verifySignature(agent); err != nil {
		return err
	}
	return a.allowsAt(createdAt)
}

// VerifyEvent verifies ev (id and signature) and then its auth tag against
// it: every condition, kind included. It returns nil, nil when ev carries no
// auth tag. A valid tag on an event that does not verify proves nothing.
func VerifyEvent(ev *nostr.Event) (*Attestation, error) {
	if err := ev.Verify(); err != nil {
		return nil, fmt.Errorf("%w: the event carrying it does not verify: %w", ErrRejected, err)
	}
	a, err := Find(ev.Tags)
	if a == nil || err != nil {
		return nil, err
	}
	if err := a.verifySignature(ev.PubKey); err != nil {
		return nil, err
	}
	if err := a.Allows(ev.Kind, ev.CreatedAt); err != nil {
		return nil, err
	}
	return a, nil
}

// Tag returns the attestation as an event tag.
func (a *Attestation) Tag() nostr.Tag {
	return nostr.Tag{TagName, a.Owner, a.Conditions, a.Sig}
}

// Sign makes owner's attestation for agent under conditions (which must
// follow the grammar).
func Sign(owner *nostr.SecretKey, agent, conditions string) (*Attestation, error) {
	if _, err := parseConditions(conditions); err != nil {
		return nil, err
	}
	sig, err := owner.SignDigest(Digest(agent, conditions))
	if err != nil {
		return nil, err
	}
	return Parse([]string{TagName, owner.PublicKeyHex(), conditions, hex.EncodeToString(sig[:])})
}
