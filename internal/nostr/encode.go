package nostr

import (
	"encoding/hex"
	"strconv"
)

// appendQuoted appends s as a JSON string using the NIP-01 escaping rules:
// only '"', '\\' and control characters are escaped (\b \t \n \f \r by name,
// the rest as \u00xx). Everything else, including '<', '>', '&', U+2028 and
// non-ASCII UTF-8, is copied verbatim. The same rules serve both the id
// preimage and outgoing JSON so that what we send hashes to what we stored.
func appendQuoted[S string | []byte](dst []byte, s S) []byte {
	dst = append(dst, '"')
	for {
		n, _ := plainPrefix(s)
		dst = append(dst, s[:n]...)
		if n == len(s) {
			break
		}
		c := s[n]
		s = s[n+1:]
		switch c {
		case '"':
			dst = append(dst, '\\', '"')
		case '\\':
			dst = append(dst, '\\', '\\')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0x0f])
		}
	}
	return append(dst, '"')
}

// AppendTagsJSON appends tags as a JSON array of arrays of strings, escaped
// as appendQuoted does.
func AppendTagsJSON(dst []byte, tags Tags) []byte { return appendTags(dst, tags) }

func appendTags(dst []byte, tags Tags) []byte {
	dst = append(dst, '[')
	for i, tag := range tags {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, '[')
		for j, v := range tag {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = appendQuoted(dst, v)
		}
		dst = append(dst, ']')
	}
	return append(dst, ']')
}

// encodedSizeHint estimates the JSON size of e so buffers are allocated once
// in the common case (few characters need escaping).
func (e *Event) encodedSizeHint() int {
	// Hex fields, keys and punctuation, plus some room for escapes.
	n := 64 + 64 + 128 + 128 + len(e.Content) + len(e.Content)/16
	for _, t := range e.Tags {
		n += 3
		for _, v := range t {
			n += len(v) + 3
		}
	}
	return n
}

// appendSerialized appends the NIP-01 id preimage
// [0,pubkey,created_at,kind,tags,content].
func (e *Event) appendSerialized(dst []byte) []byte {
	dst = append(dst, '[', '0', ',')
	dst = appendQuoted(dst, e.PubKey)
	dst = append(dst, ',')
	dst = strconv.AppendInt(dst, e.CreatedAt, 10)
	dst = append(dst, ',')
	dst = strconv.AppendInt(dst, int64(e.Kind), 10)
	dst = append(dst, ',')
	dst = appendTags(dst, e.Tags)
	dst = append(dst, ',')
	dst = appendQuoted(dst, e.Content)
	return append(dst, ']')
}

// AppendJSON appends the compact JSON object for e to dst. A nil Tags is
// written as [] because NIP-01 requires the field to be an array.
func (e *Event) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"id":`...)
	dst = appendQuoted(dst, e.ID)
	dst = append(dst, `,"pubkey":`...)
	dst = appendQuoted(dst, e.PubKey)
	dst = append(dst, `,"created_at":`...)
	dst = strconv.AppendInt(dst, e.CreatedAt, 10)
	dst = append(dst, `,"kind":`...)
	dst = strconv.AppendInt(dst, int64(e.Kind), 10)
	dst = append(dst, `,"tags":`...)
	dst = appendTags(dst, e.Tags)
	dst = append(dst, `,"content":`...)
	dst = appendQuoted(dst, e.Content)
	dst = append(dst, `,"sig":`...)
	dst = appendQuoted(dst, e.Sig)
	return append(dst, '}')
}

// RawEventID returns the hex id leading JSON that AppendJSON or
// AppendStoredJSON wrote (a subslice of raw), or nil for other JSON.
func RawEventID(raw []byte) []byte {
	const head = `{"id":"`
	end := len(head) + 64
	if len(raw) <= end || string(raw[:len(head)]) != head || raw[end] != '"' {
		return nil
	}
	return raw[len(head):end]
}

// AppendStoredJSON appends what AppendJSON would for an event read back
// from storage, built from the row's own bytes: id, pubkey and sig raw,
// tags as PostgreSQL prints a jsonb array, content as stored. No Event,
// tag slice or hex string is made on the way: a stored read sends rows, it
// does not inspect them.
//
// jsonb prints strings with the escapes appendQuoted uses (the names for
// \b \t \n \f \r, \u00xx for other control characters, '"' and '\\',
// nothing else) and separates elements with ", ": dropping the spaces
// outside strings gives AppendJSON's bytes.
func AppendStoredJSON(dst, id, pubkey []byte, createdAt int64, kind int, tagsJSONB, content, sig []byte) []byte {
	dst = append(dst, `{"id":"`...)
	dst = hex.AppendEncode(dst, id)
	dst = append(dst, `","pubkey":"`...)
	dst = hex.AppendEncode(dst, pubkey)
	dst = append(dst, `","created_at":`...)
	dst = strconv.AppendInt(dst, createdAt, 10)
	dst = append(dst, `,"kind":`...)
	dst = strconv.AppendInt(dst, int64(kind), 10)
	dst = append(dst, `,"tags":`...)
	dst = appendCompactJSON(dst, tagsJSONB)
	dst = append(dst, `,"content":`...)
	dst = appendQuoted(dst, content)
	dst = append(dst, `,"sig":"`...)
	dst = hex.AppendEncode(dst, sig)
	return append(dst, `"}`...)
}

// appendCompactJSON appends JSON text without the whitespace between its
// tokens; strings are copied as they are.
func appendCompactJSON(dst, src []byte) []byte {
	for i := 0; i < len(src); i++ {
		switch c := src[i]; c {
		case ' ', '\t', '\n', '\r':
		case '"':
			end := i + 1
			for end < len(src) && src[end] != '"' {
				if src[end] == '\\' {
					end++
				}
				end++
			}
			end = min(end+1, len(src))
			dst = append(dst, src[i:end]...)
			i = end - 1
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// MarshalJSON returns the compact JSON object for e. Note that json.Marshal
// re-escapes '<', '>' and '&' in a Marshaler's output; call MarshalJSON or
// AppendJSON directly when the exact NIP-01 bytes matter.
func (e *Event) MarshalJSON() ([]byte, error) {
	return e.AppendJSON(make([]byte, 0, e.encodedSizeHint())), nil
}

// Relay-to-client messages (NIP-01, NIP-42, NIP-45).

// EncodeOK returns ["OK",<event id>,<ok>,<msg>].
func EncodeOK(eventID string, ok bool, msg string) []byte {
	b := make([]byte, 0, 16+len(eventID)+len(msg))
	b = append(b, `["OK",`...)
	b = appendQuoted(b, eventID)
	if ok {
		b = append(b, `,true,`...)
	} else {
		b = append(b, `,false,`...)
	}
	b = appendQuoted(b, msg)
	return append(b, ']')
}

// EncodeEOSE returns ["EOSE",<sub id>].
func EncodeEOSE(subID string) []byte {
	b := make([]byte, 0, 12+len(subID))
	b = append(b, `["EOSE",`...)
	b = appendQuoted(b, subID)
	return append(b, ']')
}

// EncodeClosed returns ["CLOSED",<sub id>,<msg>].
func EncodeClosed(subID, msg string) []byte {
	b := make([]byte, 0, 16+len(subID)+len(msg))
	b = append(b, `["CLOSED",`...)
	b = appendQuoted(b, subID)
	b = append(b, ',')
	b = appendQuoted(b, msg)
	return append(b, ']')
}

// EncodeNotice returns ["NOTICE",<msg>].
func EncodeNotice(msg string) []byte {
	b := make([]byte, 0, 14+len(msg))
	b = append(b, `["NOTICE",`...)
	b = appendQuoted(b, msg)
	return append(b, ']')
}

// EncodeAuthChallenge returns ["AUTH",<challenge>] (NIP-42).
func EncodeAuthChallenge(challenge string) []byte {
	b := make([]byte, 0, 12+len(challenge))
	b = append(b, `["AUTH",`...)
	b = appendQuoted(b, challenge)
	return append(b, ']')
}

// EncodeEvent returns ["EVENT",<sub id>,<event>].
func EncodeEvent(subID string, ev *Event) []byte {
	b := make([]byte, 0, 16+len(subID)+ev.encodedSizeHint())
	b = append(b, `["EVENT",`...)
	b = appendQuoted(b, subID)
	b = append(b, ',')
	b = ev.AppendJSON(b)
	return append(b, ']')
}

// EncodeEventRaw is EncodeEvent for an event already encoded with
// MarshalJSON/AppendJSON, so fan-out encodes each event once. rawEvent is
// trusted to be a valid JSON object.
func EncodeEventRaw(subID string, rawEvent []byte) []byte {
	return AppendEventRaw(make([]byte, 0, 16+len(subID)+len(rawEvent)), subID, rawEvent)
}

// AppendEventRaw appends what EncodeEventRaw returns to dst, so a writer
// can build each delivery in a buffer it reuses.
func AppendEventRaw(dst []byte, subID string, rawEvent []byte) []byte {
	dst = append(dst, `["EVENT",`...)
	dst = appendQuoted(dst, subID)
	dst = append(dst, ',')
	dst = append(dst, rawEvent...)
	return append(dst, ']')
}

// EncodeCount returns ["COUNT",<sub id>,{"count":<n>}] (NIP-45), with
// "approximate":true when approximate.
func EncodeCount(subID string, count int64, approximate bool) []byte {
	b := make([]byte, 0, 56+len(subID))
	b = append(b, `["COUNT",`...)
	b = appendQuoted(b, subID)
	b = append(b, `,{"count":`...)
	b = strconv.AppendInt(b, count, 10)
	if approximate {
		b = append(b, `,"approximate":true`...)
	}
	return append(b, `}]`...)
}
