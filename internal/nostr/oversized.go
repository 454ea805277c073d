package nostr

import "bytes"

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
// The strings it reads (the verb, the subscription id, the event's keys and
// id) are decoded by the parser's own rules, escapes included, so it names
// the id the parser would. The bytes between them cost a memchr, and once
// the answer is settled the rest of the message is not looked at: an
// attacker's megabyte costs the relay its reading, not a walk byte by byte.
type OversizedMessage struct {
	done     bool // the answer is settled: later bytes cannot change it
	depth    int  // [ and { open around the next byte
	inString bool // inside a string
	keep     bool // the open string may be one of the ids: its bytes are kept
	escaped  bool // the previous byte was a backslash inside a string
	raw      []byte
	decoded  []byte
	element  int // index of the current element of the outer array
	verb     string
	inEvent  bool // inside an EVENT's event object, at its top level or below
	wantKey  bool // the event object's next string is a key
	keyIsID  bool // the event object's current value is the "id"
	id       string
	subID    string
}

// maxRawID is the longest string kept as sent, quotes included: a
// subscription id of MaxSubIDLength characters, each written as an escaped
// surrogate pair (12 bytes). An event id, the verb or a key is shorter.
const maxRawID = 64*12 + 2

// subIDLimits are the parser's limits the subscription id is checked by.
var subIDLimits = DefaultLimits()

// Write feeds the next bytes of the message; it never fails.
func (m *OversizedMessage) Write(p []byte) (int, error) {
	for i := 0; i < len(p) && !m.done; {
		switch {
		case m.inString:
			i = m.readString(p, i)
		case m.depth > 2:
			i = m.skipNested(p, i)
		case m.depth > 0 && !structural[p[i]]:
			i++
		default:
			m.structure(p[i])
			i++
		}
	}
	return len(p), nil
}

// structural marks the bytes that matter outside a string.
var structural = [256]bool{'"': true, '[': true, ']': true, '{': true, '}': true, ',': true, ':': true}

// skipNested reads p from i, outside a string, while it is nested below the
// outer array's elements and the event object's fields (the tags), where
// only the brackets and the strings' ends matter, and returns where it
// stopped: a string of a few bytes is walked here, a longer one is left to
// readString.
func (m *OversizedMessage) skipNested(p []byte, i int) int {
	for i < len(p) && m.depth > 2 {
		switch p[i] {
		case '"':
			j := i + 1
			for short := min(len(p), j+shortRun); j < short && p[j] != '"'; j++ {
				if p[j] == '\\' {
					j++
				}
			}
			if j < len(p) && p[j] == '"' {
				i = j + 1
				continue
			}
			m.inString, m.keep = true, false
			return m.readString(p, i+1)
		case '[', '{':
			m.depth++
		case ']', '}':
			m.depth--
		}
		i++
	}
	return i
}

// shortRun is how far inside a string bytes are looked at one by one before
// memchr is asked: a call per byte would cost more than the walk when the
// quotes and backslashes come close together.
const shortRun = 16

// readString reads p from i, inside a string, up to the string's end or
// p's, and returns where it stopped. Only the quote and the backslash
// matter inside a string; the runs between them are skipped (or kept)
// whole.
func (m *OversizedMessage) readString(p []byte, i int) int {
	quote := -1 // where the next '"' at or after i is, once looked up
	for i < len(p) {
		if m.escaped {
			m.escaped = false
			m.keepBytes(p[i : i+1])
			i++
			continue
		}
		j := i
		for short := min(len(p), i+shortRun); j < short && p[j] != '"' && p[j] != '\\'; j++ {
		}
		if j == i+shortRun {
			if quote < j {
				if quote = bytes.IndexByte(p[j:], '"'); quote < 0 {
					quote = len(p)
				} else {
					quote += j
				}
			}
			if bs := bytes.IndexByte(p[j:quote], '\\'); bs >= 0 {
				j += bs
			} else {
				j = quote
			}
		}
		m.keepBytes(p[i:j])
		if i = j; i == len(p) {
			break
		}
		m.keepBytes(p[i : i+1])
		i++
		if p[i-1] == '\\' {
			m.escaped = true
			continue
		}
		m.inString = false
		m.endString()
		break
	}
	return i
}

func (m *OversizedMessage) keepBytes(b []byte) {
	if !m.keep {
		return
	}
	if len(m.raw)+len(b) > maxRawID {
		m.keep = false
		return
	}
	m.raw = append(m.raw, b...)
}

func (m *OversizedMessage) structure(b byte) {
	if m.depth == 0 && b != '[' {
		// Before the outer array only whitespace may come, and nothing
		// after it.
		m.done = b != ' ' && b != '\t' && b != '\n' && b != '\r'
		return
	}
	switch b {
	case '"':
		m.inString = true
		m.keep = m.depth == 1 && (m.element == 0 || m.element == 1 && (m.verb == "REQ" || m.verb == "COUNT")) ||
			m.depth == 2 && m.inEvent && (m.wantKey || m.keyIsID)
		if m.keep {
			m.raw = append(m.raw[:0], '"')
		}
	case '[', '{':
		m.depth++
		if m.depth == 2 && b == '{' && m.element == 1 && m.verb == "EVENT" {
			m.inEvent, m.wantKey = true, true
		}
	case ']', '}':
		m.depth--
		// The event object or the outer array closed: no id can follow.
		m.done = m.depth < 2 && m.inEvent || m.depth <= 0
	case ',':
		switch {
		case m.depth == 1:
			m.element++
			// The verb was not a string, or the element that holds the id
			// has passed.
			m.done = m.element == 1 && m.verb == "" || m.element >= 2
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
	s, ok := m.decodeKept()
	switch {
	case m.depth == 1 && m.element == 0:
		m.verb = ""
		if ok {
			switch string(s) {
			case "EVENT":
				m.verb = "EVENT"
			case "REQ":
				m.verb = "REQ"
			case "COUNT":
				m.verb = "COUNT"
			}
		}
		// No other verb is answered by anything but a NOTICE.
		m.done = m.verb == ""
	case m.depth == 1 && m.element == 1 && (m.verb == "REQ" || m.verb == "COUNT"):
		if ok && subIDLimits.checkSubID(string(s)) == nil {
			m.subID = string(s)
		}
		m.done = true
	case m.depth == 2 && m.inEvent && m.wantKey:
		m.keyIsID = ok && string(s) == "id"
	case m.depth == 2 && m.inEvent && m.keyIsID:
		if ok && answerableID(s) {
			m.id = string(s)
			m.done = true
		}
	}
}

// decodeKept decodes the string just closed, as the parser would, if it
// was kept whole; ok is false for one the parser refuses.
func (m *OversizedMessage) decodeKept() (s []byte, ok bool) {
	if !m.keep {
		return nil, false
	}
	d := getDecoder(m.raw)
	s, err := d.appendStr(m.decoded[:0])
	ok = err == nil && d.pos == len(m.raw)
	putDecoder(d)
	m.decoded = s[:0]
	return s, ok
}

// EventID is the id of an oversized EVENT, the one its OK refusal names; ""
// when the message is not an EVENT or its id could not be read.
func (m *OversizedMessage) EventID() string {
	if m.verb != "EVENT" {
		return ""
	}
	return m.id
}

// SubID is the subscription id the refusal closes, an oversized REQ's or
// COUNT's; "" when the message is neither or its id could not be read.
func (m *OversizedMessage) SubID() string { return m.subID }

// Refusal is the answer to the message: OK false for an EVENT whose id was
// read, CLOSED for a REQ or COUNT whose subscription id was, a NOTICE
// otherwise; reason carries its NIP-01 prefix.
func (m *OversizedMessage) Refusal(reason string) []byte {
	switch {
	case m.EventID() != "":
		return EncodeOK(m.id, false, reason)
	case m.subID != "":
		return EncodeClosed(m.subID, reason)
	default:
		return EncodeNotice(reason)
	}
}
