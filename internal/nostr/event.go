// Package nostr implements the NIP-01 wire format and event cryptography:
// strict parsing of client messages, canonical serialization, event ids,
// BIP-340 signatures, filters and relay-to-client message encoding.
package nostr

import (
	"crypto/sha256"
	"errors"
	"fmt"
)

// Event is a NIP-01 event. ID, PubKey and Sig are lowercase hex strings as on
// the wire; IDBytes, PubKeyBytes and SigBytes decode them.
type Event struct {
	ID        string `json:"id"`
	PubKey    string `json:"pubkey"`
	CreatedAt int64  `json:"created_at"`
	Kind      int    `json:"kind"`
	Tags      Tags   `json:"tags"`
	Content   string `json:"content"`
	Sig       string `json:"sig"`
}

// Tag is one event tag: a name followed by values.
type Tag []string

// Tags is the tag list of an event.
type Tags []Tag

// First returns the first tag named name that has a value, or nil.
func (t Tags) First(name string) Tag {
	for _, tag := range t {
		if len(tag) >= 2 && tag[0] == name {
			return tag
		}
	}
	return nil
}

// Has reports whether some tag is named name, with or without values: flags
// such as NIP-29's bare ["private"] carry none, so First does not see them.
func (t Tags) Has(name string) bool {
	for _, tag := range t {
		if len(tag) >= 1 && tag[0] == name {
			return true
		}
	}
	return false
}

// Values returns the first value of every tag named name.
func (t Tags) Values(name string) []string {
	var vals []string
	for _, tag := range t {
		if len(tag) >= 2 && tag[0] == name {
			vals = append(vals, tag[1])
		}
	}
	return vals
}

// hasAnyIn is hasAny for a set of values.
func (t Tags) hasAnyIn(name string, vals map[string]struct{}) bool {
	for _, tag := range t {
		if len(tag) < 2 || tag[0] != name {
			continue
		}
		if _, ok := vals[tag[1]]; ok {
			return true
		}
	}
	return false
}

// hasAny reports whether some tag is named name and its first value is in vals.
func (t Tags) hasAny(name string, vals []string) bool {
	for _, tag := range t {
		if len(tag) < 2 || tag[0] != name {
			continue
		}
		for _, v := range vals {
			if tag[1] == v {
				return true
			}
		}
	}
	return false
}

// DTag returns the value of the first "d" tag, or "" (the identifier of an
// addressable event).
func (e *Event) DTag() string {
	if t := e.Tags.First("d"); t != nil {
		return t[1]
	}
	return ""
}

// Serialize returns the NIP-01 id preimage [0,pubkey,created_at,kind,tags,content].
func (e *Event) Serialize() []byte {
	return e.appendSerialized(make([]byte, 0, e.encodedSizeHint()))
}

// ComputeID returns the sha256 of the canonical serialization.
func (e *Event) ComputeID() [32]byte {
	// A stack buffer covers typical events without a heap allocation.
	var buf [1024]byte
	return sha256.Sum256(e.appendSerialized(buf[:0]))
}

// CheckID reports whether ID is 64 lowercase hex and matches the content.
func (e *Event) CheckID() bool {
	if !IsHex64(e.ID) {
		return false
	}
	id := e.ComputeID()
	return hexEqual(id[:], e.ID)
}

// IDBytes decodes ID; it is all zeros if ID is not 64 lowercase hex.
func (e *Event) IDBytes() [32]byte {
	b, _ := DecodeHex32(e.ID)
	return b
}

// PubKeyBytes decodes PubKey; it is all zeros if PubKey is not 64 lowercase hex.
func (e *Event) PubKeyBytes() [32]byte {
	b, _ := DecodeHex32(e.PubKey)
	return b
}

// SigBytes decodes Sig; it is all zeros if Sig is not 128 lowercase hex.
func (e *Event) SigBytes() [64]byte {
	var b [64]byte
	if !decodeLowerHex(b[:], e.Sig) {
		return [64]byte{}
	}
	return b
}

// Errors returned by Verify and VerifySignature; test with errors.Is.
var (
	ErrBadID        = errors.New("bad event id")
	ErrBadSignature = errors.New("bad signature")
)

// VerifySignature checks the BIP-340 signature against the id recomputed from
// the event body; it ignores the ID field, so a valid signature always
// authenticates the content. Errors wrap ErrBadSignature.
func (e *Event) VerifySignature() error {
	return e.verifySig(e.ComputeID())
}

// Verify checks the id and then the signature, hashing the event only once.
// Errors wrap ErrBadID or ErrBadSignature so the caller can tell them apart.
func (e *Event) Verify() error {
	id := e.ComputeID()
	if !hexEqual(id[:], e.ID) {
		return ErrBadID
	}
	return e.verifySig(id)
}

func (e *Event) verifySig(id [32]byte) error {
	var pk [32]byte
	if !decodeLowerHex(pk[:], e.PubKey) {
		return fmt.Errorf("%w: pubkey must be 64-char lowercase hex", ErrBadSignature)
	}
	var sb [64]byte
	if !decodeLowerHex(sb[:], e.Sig) {
		return fmt.Errorf("%w: sig must be 128-char lowercase hex", ErrBadSignature)
	}
	return verifySchnorr(&pk, &id, &sb)
}

// Sign sets PubKey, ID and Sig using sk. A nil Tags becomes empty so the
// struct matches what a parser would produce.
func (e *Event) Sign(sk *SecretKey) error {
	if e.Tags == nil {
		e.Tags = Tags{}
	}
	var pub [64]byte
	e.PubKey = string(appendHex(pub[:0], sk.pub[:]))
	id := e.ComputeID()

	sig, err := sk.SignDigest(id)
	if err != nil {
		return err
	}
	var buf [128]byte
	e.ID = string(appendHex(buf[:0], id[:]))
	e.Sig = string(appendHex(buf[:0], sig[:]))
	return nil
}

// UnmarshalJSON decodes an event object with the same strict validation as
// ParseClientMessage, without size limits.
func (e *Event) UnmarshalJSON(b []byte) error {
	ev, err := ParseEvent(b, Limits{})
	if err != nil {
		return err
	}
	*e = *ev
	return nil
}

// ParseEvent decodes and validates the shape of one event object (it does not
// check the id or signature). Errors are *ParseError with EventID set when
// the id was readable.
func ParseEvent(data []byte, lim Limits) (*Event, error) {
	d := getDecoder(data)
	defer putDecoder(d)
	ev, id, err := d.event(&lim)
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return nil, &ParseError{EventID: id, Msg: err.Error()}
	}
	return ev, nil
}
