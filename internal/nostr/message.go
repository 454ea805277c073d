package nostr

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// Limits bounds what ParseClientMessage accepts. A zero or negative field
// means no limit.
type Limits struct {
	MaxFilters      int // filters per REQ/COUNT
	MaxSubIDLength  int // characters in a subscription id
	MaxFilterValues int // ids+authors+kinds+tag values in one filter
	MaxTagValueLen  int // bytes in one "#x" filter value
	MaxSearchBytes  int // bytes in one NIP-50 search string
	MaxEventTags    int // tags in one event
	// MaxContentLength counts characters (Unicode code points) of event
	// content, as NIP-11's max_content_length does; the message size bounds
	// its bytes.
	MaxContentLength int
}

// DefaultLimits returns limits suitable for a public relay.
func DefaultLimits() Limits {
	return Limits{
		MaxFilters:       10,
		MaxSubIDLength:   64, // NIP-01's recommended maximum
		MaxFilterValues:  1000,
		MaxTagValueLen:   1024,
		MaxSearchBytes:   1024,
		MaxEventTags:     2000,
		MaxContentLength: 64 << 10,
	}
}

// ClientMessage is one of *EventMessage, *ReqMessage, *CountMessage,
// *CloseMessage or *AuthMessage.
type ClientMessage interface{ isClientMessage() }

// EventMessage is ["EVENT", event].
type EventMessage struct{ Event *Event }

// ReqMessage is ["REQ", subid, filter...].
type ReqMessage struct {
	SubID   string
	Filters Filters
}

// CountMessage is ["COUNT", subid, filter...] (NIP-45).
type CountMessage struct {
	SubID   string
	Filters Filters
}

// CloseMessage is ["CLOSE", subid].
type CloseMessage struct{ SubID string }

// AuthMessage is ["AUTH", event] (NIP-42).
type AuthMessage struct{ Event *Event }

// Pointer receivers make a type switch on the value types a compile error.
func (*EventMessage) isClientMessage() {}
func (*ReqMessage) isClientMessage()   {}
func (*CountMessage) isClientMessage() {}
func (*CloseMessage) isClientMessage() {}
func (*AuthMessage) isClientMessage()  {}

// ParseError describes a rejected client message. Msg is short and human
// readable, without the "invalid: " prefix. Verb is the message type when it
// was recognised, SubID the subscription id when it was valid, and EventID
// the event id as sent when it was a string the answer may name (lowercase
// hex or not, see answerableID), so the relay can answer with OK, CLOSED or
// NOTICE as appropriate.
type ParseError struct {
	Verb    string
	SubID   string
	EventID string
	Msg     string
}

func (e *ParseError) Error() string { return e.Msg }

// ParseClientMessage parses one WebSocket text frame from a client. It checks
// shape and limits only; event ids and signatures are checked separately
// (Event.Verify) so the relay can report which one failed. Errors are always
// *ParseError.
func ParseClientMessage(data []byte, lim Limits) (ClientMessage, error) {
	d := getDecoder(data)
	defer putDecoder(d)
	m, err := d.clientMessage(&lim)
	if err != nil {
		return nil, err
	}
	return m, nil
}

func (d *decoder) clientMessage(lim *Limits) (ClientMessage, *ParseError) {
	if !d.consume('[') {
		return nil, &ParseError{Msg: "message must be a JSON array"}
	}
	switch d.peek() {
	case ']':
		return nil, &ParseError{Msg: "empty message array"}
	case '"':
	default:
		return nil, &ParseError{Msg: "message type must be a string"}
	}
	v, err := d.appendStr(d.scratch[:0])
	d.scratch = v[:0]
	if err != nil {
		return nil, &ParseError{Msg: err.Error()}
	}
	var verb string
	switch string(v) {
	case "EVENT":
		verb = "EVENT"
	case "REQ":
		verb = "REQ"
	case "COUNT":
		verb = "COUNT"
	case "CLOSE":
		verb = "CLOSE"
	case "AUTH":
		verb = "AUTH"
	default:
		return nil, &ParseError{Msg: fmt.Sprintf("unknown message type %q", truncate(v, 32))}
	}
	// Allocate the error only on failure: parsing must be cheap when it succeeds.
	var subID, eventID string
	fail := func(err error) (ClientMessage, *ParseError) {
		return nil, &ParseError{Verb: verb, SubID: subID, EventID: eventID, Msg: err.Error()}
	}

	var m ClientMessage
	switch verb {
	case "EVENT", "AUTH":
		if !d.consume(',') {
			return fail(fmt.Errorf("%s message must have 2 elements", verb))
		}
		ev, id, err := d.event(lim)
		eventID = id
		if err != nil {
			return fail(err)
		}
		if verb == "EVENT" {
			m = &EventMessage{Event: ev}
		} else {
			m = &AuthMessage{Event: ev}
		}
		if d.peek() == ',' {
			return fail(fmt.Errorf("%s message must have exactly 2 elements", verb))
		}
	case "REQ", "COUNT", "CLOSE":
		if !d.consume(',') {
			return fail(errors.New("missing subscription id"))
		}
		if d.peek() != '"' {
			return fail(d.wrongType(errors.New("subscription id must be a string")))
		}
		sub, err := d.string()
		if err != nil {
			return fail(err)
		}
		if err := lim.checkSubID(sub); err != nil {
			return fail(err)
		}
		subID = sub
		if verb == "CLOSE" {
			if d.peek() == ',' {
				return fail(errors.New("CLOSE message must have exactly 2 elements"))
			}
			m = &CloseMessage{SubID: sub}
			break
		}
		fs, err := d.filters(lim)
		if err != nil {
			return fail(err)
		}
		if verb == "REQ" {
			m = &ReqMessage{SubID: sub, Filters: fs}
		} else {
			m = &CountMessage{SubID: sub, Filters: fs}
		}
	}
	if !d.consume(']') {
		return fail(d.syntaxErr())
	}
	if err := d.end(); err != nil {
		return fail(err)
	}
	return m, nil
}

// checkSubID refuses a subscription id the relay does not take.
func (lim *Limits) checkSubID(sub string) error {
	if sub == "" {
		return errors.New("subscription id must not be empty")
	}
	// Characters, as NIP-01 and NIP-11's max_subid_length count them:
	// a client may spend 64 on an id in any script.
	if lim.MaxSubIDLength > 0 && len(sub) > lim.MaxSubIDLength && utf8.RuneCountInString(sub) > lim.MaxSubIDLength {
		return fmt.Errorf("subscription id too long (max %d characters)", lim.MaxSubIDLength)
	}
	return nil
}

// filters reads `,filter` elements up to (not including) the closing bracket.
func (d *decoder) filters(lim *Limits) (Filters, error) {
	var fs Filters
	for d.consume(',') {
		if lim.MaxFilters > 0 && len(fs) == lim.MaxFilters {
			return nil, fmt.Errorf("too many filters (max %d)", lim.MaxFilters)
		}
		fs = append(fs, Filter{})
		if err := d.filter(&fs[len(fs)-1], lim); err != nil {
			return nil, atFilter(err, len(fs)-1)
		}
	}
	if len(fs) == 0 && d.peek() == ']' {
		return nil, errors.New("at least one filter is required")
	}
	return fs, nil
}

// ParseFilters parses a JSON array of filters ([{...}, ...]) with the same
// rules and limits as the filters of a REQ or COUNT, for transports other
// than WebSocket (the HTTP bridge's {"filters": [...]}).
func ParseFilters(data []byte, lim Limits) (Filters, error) {
	d := getDecoder(data)
	defer putDecoder(d)
	fs, err := d.filterArray(&lim)
	if err == nil {
		err = d.end()
	}
	return fs, err
}

func (d *decoder) filterArray(lim *Limits) (Filters, error) {
	if !d.consume('[') {
		return nil, errors.New("filters must be a JSON array")
	}
	if d.consume(']') {
		return nil, errors.New("at least one filter is required")
	}
	var fs Filters
	for {
		if lim.MaxFilters > 0 && len(fs) == lim.MaxFilters {
			return nil, fmt.Errorf("too many filters (max %d)", lim.MaxFilters)
		}
		fs = append(fs, Filter{})
		if err := d.filter(&fs[len(fs)-1], lim); err != nil {
			return nil, atFilter(err, len(fs)-1)
		}
		if d.consume(',') {
			continue
		}
		if d.consume(']') {
			return fs, nil
		}
		return nil, d.syntaxErr()
	}
}
