package nostr

import (
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"
)

// decoder is a small single-pass JSON reader specialised for Nostr messages.
// It is stricter than encoding/json (invalid UTF-8, lone surrogate escapes and
// duplicate keys are errors) and lets us validate while decoding, so an EVENT
// frame is read exactly once.
type decoder struct {
	data []byte
	pos  int

	scratch []byte // decoded keys and throwaway strings

	// Event strings are decoded into one buffer and turned into a single Go
	// string at the end; fields and tag values are substrings of it. This
	// replaces one allocation per string with one per event.
	str     []byte
	tagVals []span // every tag value, flattened
	tagLens []int  // number of values in each tag
}

type span struct{ off, end int }

var decoderPool = sync.Pool{New: func() any { return new(decoder) }}

func getDecoder(data []byte) *decoder {
	d := decoderPool.Get().(*decoder)
	d.data, d.pos = data, 0
	return d
}

func putDecoder(d *decoder) {
	// Do not let one huge message pin memory in the pool.
	const maxKeep = 256 << 10
	if cap(d.str) > maxKeep || cap(d.scratch) > maxKeep || cap(d.tagVals) > maxKeep/16 {
		return
	}
	d.data = nil
	decoderPool.Put(d)
}

// maxDepth bounds nesting in skipped values (unknown event fields).
const maxDepth = 64

func (d *decoder) syntaxErr() error {
	if d.pos >= len(d.data) {
		return errors.New("malformed JSON: unexpected end of input")
	}
	return fmt.Errorf("malformed JSON at offset %d", d.pos)
}

func (d *decoder) skipWS() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

// peek skips whitespace and returns the next byte, or 0 at end of input.
func (d *decoder) peek() byte {
	d.skipWS()
	if d.pos < len(d.data) {
		return d.data[d.pos]
	}
	return 0
}

// consume skips whitespace and consumes c if it is next.
func (d *decoder) consume(c byte) bool {
	if d.peek() == c {
		d.pos++
		return true
	}
	return false
}

// end checks that only whitespace remains.
func (d *decoder) end() error {
	if d.peek() != 0 || d.pos < len(d.data) {
		return errors.New("unexpected data after end of message")
	}
	return nil
}

// appendStr decodes the JSON string at the current position (after
// whitespace) and appends its UTF-8 bytes to dst.
func (d *decoder) appendStr(dst []byte) ([]byte, error) {
	if d.peek() != '"' {
		return dst, d.syntaxErr()
	}
	data := d.data
	i := d.pos + 1
	mark := len(dst)
	ascii := true
	start := i
	for {
		// Copy the run of bytes that need no decoding in one go.
		n, runASCII := plainPrefix(data[i:])
		i += n
		ascii = ascii && runASCII
		dst = append(dst, data[start:i]...)
		if i >= len(data) {
			d.pos = i
			return dst, d.syntaxErr()
		}
		c := data[i]
		if c == '"' {
			break
		}
		if c < 0x20 {
			d.pos = i
			return dst, fmt.Errorf("malformed JSON: control character in string at offset %d", i)
		}
		// Escape sequence.
		if i+1 >= len(data) {
			d.pos = len(data)
			return dst, d.syntaxErr()
		}
		switch data[i+1] {
		case '"', '\\', '/':
			dst = append(dst, data[i+1])
			i += 2
		case 'b':
			dst = append(dst, '\b')
			i += 2
		case 'f':
			dst = append(dst, '\f')
			i += 2
		case 'n':
			dst = append(dst, '\n')
			i += 2
		case 'r':
			dst = append(dst, '\r')
			i += 2
		case 't':
			dst = append(dst, '\t')
			i += 2
		case 'u':
			r, ok := hex4(data, i+2)
			if !ok {
				d.pos = i
				return dst, fmt.Errorf("malformed JSON: bad \\u escape at offset %d", i)
			}
			i += 6
			if r >= 0xd800 && r < 0xe000 {
				// Only a high surrogate followed by a low one forms a code
				// point; a lone half has no UTF-8 encoding.
				var lo rune
				if r < 0xdc00 && i+1 < len(data) && data[i] == '\\' && data[i+1] == 'u' {
					lo, ok = hex4(data, i+2)
				} else {
					ok = false
				}
				if !ok || lo < 0xdc00 || lo >= 0xe000 {
					d.pos = i - 6
					return dst, fmt.Errorf("invalid unicode escape (lone surrogate) at offset %d", d.pos)
				}
				r = 0x10000 + (r-0xd800)<<10 + (lo - 0xdc00)
				i += 6
			}
			dst = utf8.AppendRune(dst, r)
		default:
			d.pos = i
			return dst, fmt.Errorf("malformed JSON: bad escape at offset %d", i)
		}
		start = i
	}
	d.pos = i + 1
	if !ascii && !utf8.Valid(dst[mark:]) {
		return dst, errors.New("invalid UTF-8 in string")
	}
	return dst, nil
}

// hex4 reads 4 hex digits (either case, as JSON allows) at data[i:].
func hex4(data []byte, i int) (rune, bool) {
	if i+4 > len(data) {
		return 0, false
	}
	var r rune
	for _, c := range data[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// key reads an object key and the following colon. The result aliases
// d.scratch and is valid until the next call that uses scratch.
func (d *decoder) key() ([]byte, error) {
	k, err := d.appendStr(d.scratch[:0])
	d.scratch = k[:0]
	if err != nil {
		return nil, err
	}
	if !d.consume(':') {
		return nil, d.syntaxErr()
	}
	return k, nil
}

// string reads a string value into a new Go string.
func (d *decoder) string() (string, error) {
	b, err := d.appendStr(d.scratch[:0])
	d.scratch = b[:0]
	return string(b), err
}

// number reads a JSON number. ok reports whether it is a non-negative integer
// literal (no fraction or exponent) that fits in int64; every integer field
// in NIP-01 is of that kind, and 1.0 or 1e3 are rejected rather than guessed.
func (d *decoder) number() (v int64, ok bool, err error) {
	data := d.data
	i := d.pos
	neg := i < len(data) && data[i] == '-'
	if neg {
		i++
	}
	digits := i
	switch {
	case i < len(data) && data[i] == '0':
		i++
	case i < len(data) && data[i] >= '1' && data[i] <= '9':
		for i < len(data) && data[i] >= '0' && data[i] <= '9' {
			i++
		}
	default:
		d.pos = i
		return 0, false, d.syntaxErr()
	}
	intEnd := i
	isInt := true
	if i < len(data) && data[i] == '.' {
		i++
		if i >= len(data) || data[i] < '0' || data[i] > '9' {
			d.pos = i
			return 0, false, d.syntaxErr()
		}
		for i < len(data) && data[i] >= '0' && data[i] <= '9' {
			i++
		}
		isInt = false
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		if i >= len(data) || data[i] < '0' || data[i] > '9' {
			d.pos = i
			return 0, false, d.syntaxErr()
		}
		for i < len(data) && data[i] >= '0' && data[i] <= '9' {
			i++
		}
		isInt = false
	}
	d.pos = i
	if !isInt || intEnd-digits > 19 {
		return 0, false, nil
	}
	var u uint64 // 19 decimal digits always fit in a uint64
	for _, c := range data[digits:intEnd] {
		u = u*10 + uint64(c-'0')
	}
	if u > 1<<63-1 || (neg && u != 0) {
		return 0, false, nil
	}
	return int64(u), true, nil
}

// intValue reads a value that must be a non-negative integer <= max. A
// well-formed value of the wrong type or range yields ok=false, err=nil.
func (d *decoder) intValue(max int64) (v int64, ok bool, err error) {
	c := d.peek()
	if c != '-' && (c < '0' || c > '9') {
		return 0, false, d.skip(0)
	}
	v, ok, err = d.number()
	if err != nil || !ok || v > max {
		return 0, false, err
	}
	return v, true, nil
}

// wrongType skips a well-formed value of the wrong type and returns bad.
// Malformed JSON takes precedence, so a truncated frame is reported as such.
func (d *decoder) wrongType(bad error) error {
	if err := d.skip(0); err != nil {
		return err
	}
	return bad
}

// literal consumes the exact bytes lit.
func (d *decoder) literal(lit string) error {
	if len(d.data)-d.pos < len(lit) || string(d.data[d.pos:d.pos+len(lit)]) != lit {
		return d.syntaxErr()
	}
	d.pos += len(lit)
	return nil
}

// skip consumes any JSON value, validating it.
func (d *decoder) skip(depth int) error {
	if depth > maxDepth {
		return errors.New("malformed JSON: nested too deeply")
	}
	switch d.peek() {
	case '"':
		b, err := d.appendStr(d.scratch[:0])
		d.scratch = b[:0]
		return err
	case '{':
		d.pos++
		if d.consume('}') {
			return nil
		}
		for {
			if _, err := d.key(); err != nil {
				return err
			}
			if err := d.skip(depth + 1); err != nil {
				return err
			}
			if d.consume(',') {
				continue
			}
			if d.consume('}') {
				return nil
			}
			return d.syntaxErr()
		}
	case '[':
		d.pos++
		if d.consume(']') {
			return nil
		}
		for {
			if err := d.skip(depth + 1); err != nil {
				return err
			}
			if d.consume(',') {
				continue
			}
			if d.consume(']') {
				return nil
			}
			return d.syntaxErr()
		}
	case 't':
		return d.literal("true")
	case 'f':
		return d.literal("false")
	case 'n':
		return d.literal("null")
	default:
		_, _, err := d.number()
		return err
	}
}
