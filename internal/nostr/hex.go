package nostr

import "unicode/utf8"

const hexDigits = "0123456789abcdef"

// lowerHexVal maps a byte to its value as a lowercase hex digit, or 0xff.
// Only lowercase is accepted: NIP-01 ids, pubkeys and sigs are lowercase on the
// wire, and accepting uppercase would let one event have two spellings.
var lowerHexVal = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for i := 0; i < 16; i++ {
		t[hexDigits[i]] = byte(i)
	}
	return t
}()

// IsLowerHex reports whether s is exactly n lowercase hex characters.
func IsLowerHex(s string, n int) bool { return isLowerHex(s, n) }

func isLowerHex[T string | []byte](s T, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if lowerHexVal[s[i]] == 0xff {
			return false
		}
	}
	return true
}

// IsHex64 reports whether s is 64 lowercase hex characters (an id or pubkey).
func IsHex64(s string) bool { return IsLowerHex(s, 64) }

// decodeLowerHex fills dst from s, which must hold exactly 2*len(dst)
// lowercase hex characters.
func decodeLowerHex(dst []byte, s string) bool {
	if len(s) != 2*len(dst) {
		return false
	}
	for i := range dst {
		hi, lo := lowerHexVal[s[2*i]], lowerHexVal[s[2*i+1]]
		if hi > 15 || lo > 15 {
			return false
		}
		dst[i] = hi<<4 | lo
	}
	return true
}

// DecodeHex32 decodes a 64-char lowercase hex string; b is zero when !ok.
func DecodeHex32(s string) (b [32]byte, ok bool) {
	if !decodeLowerHex(b[:], s) {
		return [32]byte{}, false
	}
	return b, true
}

// appendHex appends the lowercase hex encoding of b.
func appendHex(dst, b []byte) []byte {
	for _, c := range b {
		dst = append(dst, hexDigits[c>>4], hexDigits[c&0x0f])
	}
	return dst
}

// hexEqual reports whether s is the lowercase hex encoding of b, without
// allocating.
func hexEqual(b []byte, s string) bool {
	if len(s) != 2*len(b) {
		return false
	}
	for i, c := range b {
		if s[2*i] != hexDigits[c>>4] || s[2*i+1] != hexDigits[c&0x0f] {
			return false
		}
	}
	return true
}

// answerableID reports whether s, an event id refused for its form
// (uppercase hex, the wrong length), may still name the refusal: NIP-01
// answers every EVENT with OK for the id sent, and a client matches the
// answer to its publish by that id, whatever it is. Past 64 characters,
// the longest a subscription id may be, it is not an id any client means.
func answerableID(s []byte) bool {
	return len(s) > 0 && (len(s) <= 64 || utf8.RuneCount(s) <= 64)
}
