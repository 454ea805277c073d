package nostr

import (
	"errors"
	"strconv"
)

// errExpiration is an expiration tag whose value is not a timestamp.
var errExpiration = errors.New("the expiration tag must hold a unix time in seconds, in decimal digits without sign, spaces or leading zeros (NIP-40)")

// Expiration is the NIP-40 expiration of ev: the unix time (seconds) of
// its first expiration tag; ok is false without one. A value that is not a
// timestamp is an error: a client that set it expects its event to go, and
// storing it forever would not.
func (ev *Event) Expiration() (at int64, ok bool, err error) {
	tag := ev.Tags.First("expiration")
	if tag == nil {
		return 0, false, nil
	}
	at, ok = parseTimestamp(tag[1])
	if !ok {
		return 0, false, errExpiration
	}
	return at, true, nil
}

// parseTimestamp reads s as a timestamp is written in JSON's created_at:
// the decimal digits of a non-negative integer, no sign, no spaces, no
// leading zeros: one spelling per time. strconv.ParseInt alone takes "+5",
// "-0" and "007", and readers differ on them (Go relays read them as
// ParseInt does, JavaScript's parseInt reads "007" and "+5" too but stops
// at the first non-digit of "5x"); clients write String(n) or FormatInt,
// which never produce them, so refusing them costs no real client.
func parseTimestamp(s string) (int64, bool) {
	if s == "" || len(s) > 1 && s[0] == '0' {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	at, err := strconv.ParseInt(s, 10, 64)
	return at, err == nil
}
