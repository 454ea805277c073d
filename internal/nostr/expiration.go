package nostr

import (
	"errors"
	"strconv"
)

// errExpiration is an expiration tag whose value is not a timestamp.
var errExpiration = errors.New("the expiration tag must hold a unix time in seconds (NIP-40)")

// Expiration is the NIP-40 expiration of ev: the unix time (seconds) of
// its first expiration tag; ok is false without one. A value that is not a
// non-negative integer is an error: a client that set it expects its event
// to go, and storing it forever would not.
func (ev *Event) Expiration() (at int64, ok bool, err error) {
	tag := ev.Tags.First("expiration")
	if tag == nil {
		return 0, false, nil
	}
	at, err = strconv.ParseInt(tag[1], 10, 64)
	if err != nil || at < 0 {
		return 0, false, errExpiration
	}
	return at, true, nil
}
