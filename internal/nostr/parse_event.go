package nostr

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// Bits for the required event fields, in canonical order.
const (
	fieldID = 1 << iota
	fieldPubKey
	fieldCreatedAt
	fieldKind
	fieldTags
	fieldContent
	fieldSig
	allEventFields = 1<<iota - 1
)

var eventFieldNames = [...]string{"id", "pubkey", "created_at", "kind", "tags", "content", "sig"}

var (
	errEventObject = errors.New("event must be a JSON object")
	errID          = errors.New("id must be 64-char lowercase hex")
	errPubKey      = errors.New("pubkey must be 64-char lowercase hex")
	errSig         = errors.New("sig must be 128-char lowercase hex")
	errCreatedAt   = errors.New("created_at must be a non-negative integer")
	errKind        = errors.New("kind must be an integer between 0 and 65535")
	errTags        = errors.New("tags must be an array of arrays of strings")
	errEmptyTag    = errors.New("tags must not contain empty tags")
	errContent     = errors.New("content must be a string")
)

// event decodes one event object. Type and value errors do not stop the scan
// (only malformed JSON does), so the id can still be reported when it comes
// after a bad field; the first error in document order wins. id is the event
// id if it was read and is well-formed, even when err != nil; with err, it is
// also an id refused for its form but answerable (answerableID), so the
// client hears OK for the id it sent.
func (d *decoder) event(lim *Limits) (ev *Event, id string, err error) {
	if !d.consume('{') {
		return nil, "", d.wrongType(errEventObject)
	}
	d.str = d.str[:0]
	d.tagVals = d.tagVals[:0]
	d.tagLens = d.tagLens[:0]

	var (
		seen      int
		firstErr  error
		idSpan    span
		pkSpan    span
		sigSpan   span
		ctSpan    span
		createdAt int64
		kind      int64
		idOK      bool
		sentID    string // an id refused for its form, as sent
	)
	fail := func(e error) {
		if firstErr == nil {
			firstErr = e
		}
	}
	// mismatch records bad for a well-formed value of the wrong type.
	mismatch := func(bad error) error {
		if err := d.skip(0); err != nil {
			return err
		}
		fail(bad)
		return nil
	}
	// hexField reads a string that must be n lowercase hex chars into d.str;
	// refused but answerable, it is kept in *refused (if not nil).
	hexField := func(n int, bad error, refused *string) (span, bool, error) {
		if d.peek() != '"' {
			return span{}, false, mismatch(bad)
		}
		off := len(d.str)
		s, err := d.appendStr(d.str)
		d.str = s
		if err != nil {
			return span{}, false, err
		}
		if !isLowerHex(s[off:], n) {
			if refused != nil && answerableID(s[off:]) {
				*refused = string(s[off:])
			}
			d.str = s[:off]
			fail(bad)
			return span{}, false, nil
		}
		return span{off, len(s)}, true, nil
	}

	// Only on failure is the id needed as its own string.
	readID := func() string {
		if idOK {
			return string(d.str[idSpan.off:idSpan.end])
		}
		return sentID
	}

	if !d.consume('}') {
		for {
			k, err := d.key()
			if err != nil {
				return nil, readID(), firstOr(firstErr, err)
			}
			field := 0
			switch string(k) {
			case "id":
				field = fieldID
			case "pubkey":
				field = fieldPubKey
			case "created_at":
				field = fieldCreatedAt
			case "kind":
				field = fieldKind
			case "tags":
				field = fieldTags
			case "content":
				field = fieldContent
			case "sig":
				field = fieldSig
			}
			switch {
			case field == 0:
				// Unknown fields are tolerated (some clients add their own)
				// but must still be valid JSON.
				err = d.skip(0)
			case seen&field != 0:
				// Two spellings of one field let different parsers see
				// different events; refuse.
				fail(fmt.Errorf("duplicate field %q", k))
				err = d.skip(0)
			default:
				seen |= field
				var ok bool
				switch field {
				case fieldID:
					idSpan, idOK, err = hexField(64, errID, &sentID)
				case fieldPubKey:
					pkSpan, _, err = hexField(64, errPubKey, nil)
				case fieldSig:
					sigSpan, _, err = hexField(128, errSig, nil)
				case fieldCreatedAt:
					if createdAt, ok, err = d.intValue(1<<63 - 1); err == nil && !ok {
						fail(errCreatedAt)
					}
				case fieldKind:
					if kind, ok, err = d.intValue(MaxKind); err == nil && !ok {
						fail(errKind)
					}
				case fieldTags:
					err = d.tags(lim, fail, mismatch)
				case fieldContent:
					if d.peek() != '"' {
						err = mismatch(errContent)
						break
					}
					off := len(d.str)
					d.str, err = d.appendStr(d.str)
					ctSpan = span{off, len(d.str)}
					// No more bytes than the limit is no more characters:
					// only longer content is counted.
					if n := ctSpan.end - ctSpan.off; err == nil && lim.MaxContentLength > 0 && n > lim.MaxContentLength &&
						utf8.RuneCount(d.str[ctSpan.off:ctSpan.end]) > lim.MaxContentLength {
						fail(fmt.Errorf("content too long (max %d characters)", lim.MaxContentLength))
					}
				}
			}
			if err != nil {
				return nil, readID(), firstOr(firstErr, err)
			}
			if d.consume(',') {
				continue
			}
			if d.consume('}') {
				break
			}
			return nil, readID(), firstOr(firstErr, d.syntaxErr())
		}
	}
	if firstErr != nil {
		return nil, readID(), firstErr
	}
	if seen != allEventFields {
		for i, name := range eventFieldNames {
			if seen&(1<<i) == 0 {
				return nil, readID(), fmt.Errorf("missing field %q", name)
			}
		}
	}

	// Materialise every string from one allocation.
	all := string(d.str)
	sub := func(s span) string { return all[s.off:s.end] }
	ev = &Event{
		ID:        sub(idSpan),
		PubKey:    sub(pkSpan),
		CreatedAt: createdAt,
		Kind:      int(kind),
		Content:   sub(ctSpan),
		Sig:       sub(sigSpan),
	}
	ev.Tags = d.decodedTags(all)
	return ev, ev.ID, nil
}

// decodedTags builds the tags decoded by d.tags as substrings of all, the
// string made of d.str.
func (d *decoder) decodedTags(all string) Tags {
	vals := make([]string, len(d.tagVals))
	for i, s := range d.tagVals {
		vals[i] = all[s.off:s.end]
	}
	tags := make(Tags, len(d.tagLens))
	o := 0
	for i, n := range d.tagLens {
		// Cap capacity so appending to one tag cannot overwrite the next.
		tags[i] = Tag(vals[o : o+n : o+n])
		o += n
	}
	return tags
}

// ParseTags decodes a tags array on its own, such as the stored tags of an
// event, with the same rules as ParseEvent (non-empty arrays of strings,
// valid UTF-8) and the same economy: every value is a substring of one
// string, where encoding/json allocates one string per value.
func ParseTags(data []byte) (Tags, error) {
	d := getDecoder(data)
	defer putDecoder(d)
	d.str, d.tagVals, d.tagLens = d.str[:0], d.tagVals[:0], d.tagLens[:0]
	var firstErr error
	fail := func(e error) {
		if firstErr == nil {
			firstErr = e
		}
	}
	mismatch := func(e error) error { return e }
	if err := d.tags(&Limits{}, fail, mismatch); err != nil {
		return nil, err
	}
	if firstErr != nil {
		return nil, firstErr
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	return d.decodedTags(string(d.str)), nil
}

func firstOr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// tags decodes the tags array into d.str/d.tagVals/d.tagLens.
func (d *decoder) tags(lim *Limits, fail func(error), mismatch func(error) error) error {
	if !d.consume('[') {
		return mismatch(errTags)
	}
	if d.consume(']') {
		return nil
	}
	for {
		if lim.MaxEventTags > 0 && len(d.tagLens) == lim.MaxEventTags {
			fail(fmt.Errorf("too many tags (max %d)", lim.MaxEventTags))
			// Keep scanning so a later id is still seen, but stop storing.
			if err := d.skipRest(']'); err != nil {
				return err
			}
			return nil
		}
		if err := d.tag(fail, mismatch); err != nil {
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
}

// tag decodes one tag (an array of strings).
func (d *decoder) tag(fail func(error), mismatch func(error) error) error {
	if !d.consume('[') {
		return mismatch(errTags)
	}
	if d.consume(']') {
		fail(errEmptyTag)
		return nil
	}
	n := 0
	for {
		if d.peek() == '"' {
			off := len(d.str)
			s, err := d.appendStr(d.str)
			d.str = s
			if err != nil {
				return err
			}
			d.tagVals = append(d.tagVals, span{off, len(s)})
			n++
		} else if err := mismatch(errTags); err != nil {
			return err
		}
		if d.consume(',') {
			continue
		}
		if d.consume(']') {
			d.tagLens = append(d.tagLens, n)
			return nil
		}
		return d.syntaxErr()
	}
}

// skipRest skips the remaining elements of an array whose opening bracket
// and at least one element have been consumed, up to and including close.
func (d *decoder) skipRest(close byte) error {
	for {
		if err := d.skip(1); err != nil {
			return err
		}
		if d.consume(',') {
			continue
		}
		if d.consume(close) {
			return nil
		}
		return d.syntaxErr()
	}
}
