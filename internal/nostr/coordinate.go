package nostr

import (
	"errors"
	"strconv"
	"strings"
)

// MaxCoordinateLen bounds a coordinate in bytes: the events table indexes
// tag values up to this length, and a deletion must be findable by the
// index that keeps an older version of its slot out.
const MaxCoordinateLen = 1024

// Coordinate names a replaceable or addressable slot: kind, author and d tag
// (always "" for a replaceable kind).
type Coordinate struct {
	Kind   int
	PubKey string // lowercase hex
	D      string
}

// String is the canonical spelling "<kind>:<pubkey>:<d>", the only one
// ParseCoordinate accepts.
func (c Coordinate) String() string {
	return strconv.Itoa(c.Kind) + ":" + c.PubKey + ":" + c.D
}

var errCoordinate = errors.New("a coordinate must be <kind>:<lowercase hex pubkey>:<d tag> with a decimal kind without sign or leading zeros")

// ParseCoordinate reads an "a" tag value. Exactly one spelling names each
// slot, so that the SQL that keeps deleted slots deleted (matching the
// literal tag value) and the Go that hides their versions agree: the kind in
// plain decimal (no sign, no leading zero), the pubkey in lowercase hex, both
// colons present, an empty d for a replaceable kind, at most
// MaxCoordinateLen bytes. The kind must be replaceable or addressable.
// migrations/010 holds the same rule in SQL (nostr_coordinate_is_canonical).
func ParseCoordinate(v string) (Coordinate, error) {
	if len(v) > MaxCoordinateLen {
		return Coordinate{}, errors.New("a coordinate must be at most 1024 bytes")
	}
	kindStr, rest, ok := strings.Cut(v, ":")
	if !ok || kindStr == "" || len(kindStr) > 5 || (kindStr[0] == '0' && kindStr != "0") {
		return Coordinate{}, errCoordinate
	}
	for i := 0; i < len(kindStr); i++ {
		if kindStr[i] < '0' || kindStr[i] > '9' {
			return Coordinate{}, errCoordinate
		}
	}
	kind, _ := strconv.Atoi(kindStr)
	pubkey, d, ok := strings.Cut(rest, ":")
	if !ok || kind > MaxKind || !IsHex64(pubkey) {
		return Coordinate{}, errCoordinate
	}
	switch {
	case IsReplaceable(kind):
		if d != "" {
			return Coordinate{}, errors.New("a coordinate of a replaceable kind ends after the pubkey's colon (empty d tag)")
		}
	case !IsAddressable(kind):
		return Coordinate{}, errors.New("a coordinate must name a replaceable or addressable kind")
	}
	return Coordinate{Kind: kind, PubKey: pubkey, D: d}, nil
}
