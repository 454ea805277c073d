package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// verb is the type of a relay-to-client message.
type verb uint8

const (
	verbUnknown verb = iota
	verbEvent
	verbOK
	verbEOSE
	verbClosed
	verbNotice
	verbAuth
	verbCount
)

var verbNames = [...]string{"unknown", "EVENT", "OK", "EOSE", "CLOSED", "NOTICE", "AUTH", "COUNT"}

// verbs maps a message type to its verb; looking it up with string(b) does
// not allocate.
var verbs = func() map[string]verb {
	m := make(map[string]verb, len(verbNames))
	for v, name := range verbNames[1:] {
		m[name] = verb(v + 1)
	}
	return m
}()

func (v verb) String() string {
	if int(v) < len(verbNames) {
		return verbNames[v]
	}
	return verbNames[verbUnknown]
}

// relayMsg is one decoded relay message. Its slices alias the frame it was
// decoded from: they are valid only until the connection reads again.
type relayMsg struct {
	Verb  verb
	SubID []byte // EVENT, EOSE, CLOSED, COUNT
	ID    []byte // OK: the event id
	OK    bool   // OK: accepted
	Text  []byte // OK, CLOSED, NOTICE: the message; AUTH: the challenge
	Event []byte // EVENT: the raw event object
	Count int64  // COUNT
}

// decodeRelayMsg decodes a relay message without copying the frame. It reads
// only what the bench needs and skips, without validating, the rest; a
// message of an unknown type decodes with Verb == verbUnknown.
func decodeRelayMsg(frame []byte) (relayMsg, error) {
	var m relayMsg
	s := scanner{b: frame}
	if !s.consume('[') {
		return m, errors.New("relay message is not a JSON array")
	}
	name := s.str()
	if s.err != nil {
		return m, s.err
	}
	m.Verb = verbs[string(name)]
	switch m.Verb {
	case verbEvent:
		m.SubID = s.nextStr()
		m.Event = s.nextObject()
	case verbOK:
		m.ID = s.nextStr()
		m.OK = s.nextBool()
		m.Text = s.nextStr()
	case verbEOSE:
		m.SubID = s.nextStr()
	case verbClosed:
		m.SubID = s.nextStr()
		m.Text = s.nextStr()
	case verbNotice, verbAuth:
		m.Text = s.nextStr()
	case verbCount:
		m.SubID = s.nextStr()
		if obj := s.nextObject(); s.err == nil {
			m.Count, s.err = countOf(obj)
		}
	default:
		return m, nil
	}
	// Tolerate trailing elements a newer relay might add.
	for s.err == nil && s.consume(',') {
		s.value()
	}
	if s.err == nil && !s.consume(']') {
		s.fail("unterminated array")
	}
	if s.err != nil {
		return relayMsg{}, fmt.Errorf("%s message: %w", m.Verb, s.err)
	}
	return m, nil
}

// countOf reads the "count" of a NIP-45 COUNT result object.
func countOf(obj []byte) (int64, error) {
	v, found, err := objectField(obj, "count")
	if err != nil {
		return 0, err
	}
	if !found {
		return 0, errors.New(`COUNT result has no "count"`)
	}
	return strconv.ParseInt(string(v), 10, 64)
}

// eventFields returns the id and content of a raw event object.
func eventFields(event []byte) (id, content []byte, err error) {
	s := scanner{b: event}
	s.object(func(key []byte) {
		switch string(key) {
		case "id":
			id = s.str()
		case "content":
			content = s.str()
		default:
			s.value()
		}
	})
	if s.err == nil && (id == nil || content == nil) {
		s.fail("event lacks id or content")
	}
	return id, content, s.err
}

// objectField returns the raw value of key in a JSON object (a string's
// contents, unquoted).
func objectField(obj []byte, key string) (val []byte, found bool, err error) {
	s := scanner{b: obj}
	s.object(func(k []byte) {
		if string(k) != key || found {
			s.value()
			return
		}
		found = true
		if s.peek() == '"' {
			val = s.str()
		} else {
			val = s.value()
		}
	})
	return val, found, s.err
}

// scanner walks JSON text. The first error sticks and turns every later
// call into a no-op, so decoders can read a whole message and check once.
type scanner struct {
	b   []byte
	i   int
	err error
}

func (s *scanner) fail(msg string) {
	if s.err == nil {
		s.err = fmt.Errorf("%s at byte %d", msg, s.i)
	}
}

func (s *scanner) skipSpace() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, or 0 at the end.
func (s *scanner) peek() byte {
	s.skipSpace()
	if s.err != nil || s.i >= len(s.b) {
		return 0
	}
	return s.b[s.i]
}

// consume skips c if it is the next non-space byte.
func (s *scanner) consume(c byte) bool {
	if s.peek() != c || c == 0 {
		return false
	}
	s.i++
	return true
}

// str reads a string and returns its contents. Strings without escapes are
// returned in place; escaped ones (rare in relay traffic) are decoded into
// a new slice.
func (s *scanner) str() []byte {
	if !s.consume('"') {
		s.fail("expected a string")
		return nil
	}
	start := s.i
	// Fast path: the next quote ends the string unless a backslash precedes it.
	if j := bytes.IndexByte(s.b[start:], '"'); j >= 0 && bytes.IndexByte(s.b[start:start+j], '\\') < 0 {
		s.i = start + j + 1
		return s.b[start : start+j]
	}
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case '\\':
			s.i += 2
			continue
		case '"':
			s.i++
			var out string
			if err := json.Unmarshal(s.b[start-1:s.i], &out); err != nil {
				s.fail("bad string escape")
				return nil
			}
			return []byte(out)
		}
		s.i++
	}
	s.fail("unterminated string")
	return nil
}

// nextStr reads ",string".
func (s *scanner) nextStr() []byte {
	if s.err == nil && !s.consume(',') {
		s.fail("missing element")
	}
	return s.str()
}

// nextBool reads ",true" or ",false".
func (s *scanner) nextBool() bool {
	if s.err == nil && !s.consume(',') {
		s.fail("missing element")
	}
	switch v := string(s.value()); v {
	case "true":
		return true
	case "false":
		return false
	}
	s.fail("expected a boolean")
	return false
}

// nextObject reads ",{...}" and returns the object's raw text.
func (s *scanner) nextObject() []byte {
	if s.err == nil && !s.consume(',') {
		s.fail("missing element")
	}
	if s.peek() != '{' {
		s.fail("expected an object")
		return nil
	}
	return s.value()
}

// object calls field for each key of an object; field must read the value.
func (s *scanner) object(field func(key []byte)) {
	if !s.consume('{') {
		s.fail("expected an object")
		return
	}
	if s.consume('}') {
		return
	}
	for s.err == nil {
		key := s.str()
		if !s.consume(':') {
			s.fail("expected ':'")
			return
		}
		field(key)
		if s.consume(',') {
			continue
		}
		if !s.consume('}') {
			s.fail("expected ',' or '}'")
		}
		return
	}
}

// value skips one value of any type and returns its raw text.
func (s *scanner) value() []byte {
	c := s.peek()
	start := s.i
	switch {
	case s.err != nil:
		return nil
	case c == '"':
		s.str()
	case c == '{' || c == '[':
		s.skipNested()
	default:
		for s.i < len(s.b) && !isDelimiter(s.b[s.i]) {
			s.i++
		}
		if s.i == start {
			s.fail("expected a value")
		}
	}
	if s.err != nil {
		return nil
	}
	return s.b[start:s.i]
}

// skipNested skips a balanced object or array, minding brackets in strings.
func (s *scanner) skipNested() {
	depth := 0
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case '"':
			s.str()
			if s.err != nil {
				return
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				s.i++
				return
			}
		}
		s.i++
	}
	s.fail("unterminated object or array")
}

func isDelimiter(c byte) bool {
	switch c {
	case ',', ']', '}', ' ', '\t', '\n', '\r':
		return true
	}
	return false
}
