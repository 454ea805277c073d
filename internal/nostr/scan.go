package nostr

// Word-at-a-time scanning of JSON string bodies. Strings are most of an
// event's bytes (content, hex ids, tag values) and almost never need
// escaping, so skipping 8 plain bytes per step roughly halves parse and
// encode time compared to a byte loop.

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

func load64[T string | []byte](s T, i int) uint64 {
	_ = s[i+7]
	return uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
		uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
}

// special reports whether w contains a byte < 0x20, '"' or '\\'. Each term is
// the classic "has a zero byte" test, exact as a yes/no answer.
func special(w uint64) bool {
	q := w ^ (lsb * '"')
	b := w ^ (lsb * '\\')
	return ((w-lsb*0x20)&^w|(q-lsb)&^q|(b-lsb)&^b)&msb != 0
}

// plainPrefix returns the length of the longest prefix of s free of '"',
// '\\' and control characters, and whether that prefix is pure ASCII.
func plainPrefix[T string | []byte](s T) (n int, ascii bool) {
	var high uint64
	i := 0
	for ; i+8 <= len(s); i += 8 {
		w := load64(s, i)
		if special(w) {
			break
		}
		high |= w
	}
	for ; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c == '"' || c == '\\' {
			break
		}
		high |= uint64(c)
	}
	return i, high&msb == 0
}
