package nostr

import "unicode/utf8"

// OversizedMessage reads, as an over-long client message streams past
// unkept, what the refusal must name for the client to match it to its
// request: an EVENT's id (NIP-01 answers every EVENT with OK) or a REQ's
// or COUNT's subscription id (answered with CLOSED). A client waits for
// that answer, and a NOTICE instead left it waiting until its own timeout:
// an event within the advertised max_content_length can exceed the message
// size (65,536 four-byte characters). It keeps one id whatever the
// message's size, and finds the id wherever the event object holds it
// (nostr-tools writes it after the content, go-nostr before).
//
// It tracks only what it needs, not whether the message is valid JSON: an
// id it reports is one the refusal may echo, never one that is trusted.
type OversizedMessage struct {
	depth    int  // [ and { open around the next byte
	inString bool // inside a string
	escaped  bool // the previous byte was a backslash inside a string
	str      []byte
	strBad   bool // the string held an escape or outgrew any id
	element  int  // index of the current element of the outer array
	verb     string
	inEvent  bool // inside an EVENT's event object, at its top level or below
	wantKey  bool // the event object's next string is a key
	keyIsID  bool // the event object's current value is the "id"
	id       string
	subID    string
}

// maxIDBytes is the longest string kept: an event id is 64 bytes and a
// subscription id at most MaxSubIDLength.
const maxIDBytes = 64

// Write feeds the next bytes of the message; it never fails.
func (m *OversizedMessage) Write(p []byte) (int, error) {
	for _, b := range p {
		m.feed(b)
	}
	return len(p), nil
}

func (m *OversizedMessage) feed(b byte) {
	if m.inString {
		switch {
		case m.escaped:
			m.escaped = false
		case b == '\\':
			m.escaped, m.strBad = true, true
		case b == '"':
			m.inString = false
			m.endString()
		case len(m.str) < maxIDBytes:
			m.str = append(m.str, b)
		default:
			m.strBad = true
		}
		return
	}
	switch b {
	case '"':
		m.inString, m.str, m.strBad = true, m.str[:0], false
	case '[', '{':
		m.depth++
		if m.depth == 2 && b == '{' && m.element == 1 && m.verb == "EVENT" {
			m.inEvent, m.wantKey = true, true
		}
	case ']', '}':
		m.depth--
		if m.depth < 2 {
			m.inEvent = false
		}
	case ',':
		switch {
		case m.depth == 1:
			m.element++
		case m.depth == 2 && m.inEvent:
			m.wantKey, m.keyIsID = true, false
		}
	case ':':
		if m.depth == 2 && m.inEvent {
			m.wantKey = false
		}
	}
}

// endString takes the string just closed if it is the verb, the
// subscription id or the event's id.
func (m *OversizedMessage) endString() {
	s := m.str
	switch {
	case m.depth == 1 && m.element == 0:
		if !m.strBad {
			m.verb = string(s)
		}
	case m.depth == 1 && m.element == 1 && (m.verb == "REQ" || m.verb == "COUNT"):
		if !m.strBad && len(s) > 0 && utf8.Valid(s) {
			m.subID = string(s)
		}
	case m.depth == 2 && m.inEvent && m.wantKey:
		m.keyIsID = !m.strBad && string(s) == "id"
	case m.depth == 2 && m.inEvent && m.keyIsID:
		if m.id == "" && !m.strBad && isLowerHex(s, 64) {
			m.id = string(s)
		}
	}
}

// ReqSubID is the subscription id of an oversized REQ, "" when the message
// is not a REQ or its id could not be read.
func (m *OversizedMessage) ReqSubID() string {
	if m.verb != "REQ" {
		return ""
	}
	return m.subID
}

// Refusal is the answer to the message: OK false for an EVENT whose id was
// read, CLOSED for a REQ or COUNT whose subscription id was, a NOTICE
// otherwise; reason carries its NIP-01 prefix.
func (m *OversizedMessage) Refusal(reason string) []byte {
	switch {
	case m.verb == "EVENT" && m.id != "":
		return EncodeOK(m.id, false, reason)
	case m.subID != "":
		return EncodeClosed(m.subID, reason)
	default:
		return EncodeNotice(reason)
	}
}
