package nostr

import (
	"errors"
	"strings"
)

// NIP-19 npub encoding and decoding (bech32, BIP-173): for clients that take
// a pubkey as a person would paste it, and for the workflow template filter
// that shows one. The wire protocol speaks hex only.

const bech32Charset = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"

var errNpub = errors.New("not a valid npub")

// DecodeNpub returns the 32-byte public key of a NIP-19 npub (all lowercase
// or all uppercase, with a valid checksum).
func DecodeNpub(s string) ([32]byte, error) {
	var key [32]byte
	if s != strings.ToLower(s) && s != strings.ToUpper(s) {
		return key, errNpub
	}
	s = strings.ToLower(s)
	hrp, data, ok := strings.Cut(s, "1")
	if !ok || hrp != "npub" || len(data) < 6 || len(s) > 90 {
		return key, errNpub
	}
	values := hrpExpand(hrp, len(data))
	for i := 0; i < len(data); i++ {
		v := strings.IndexByte(bech32Charset, data[i])
		if v < 0 {
			return key, errNpub
		}
		values = append(values, byte(v))
	}
	if bech32Polymod(values) != 1 {
		return key, errNpub
	}
	// 32 bytes are 52 five-bit groups (4 padding bits, which must be zero).
	groups := values[2*len(hrp)+1 : len(values)-6]
	if len(groups) != 52 {
		return key, errNpub
	}
	acc, bits, n := 0, 0, 0
	for _, g := range groups {
		acc = acc<<5 | int(g)
		bits += 5
		if bits >= 8 {
			bits -= 8
			key[n] = byte(acc >> bits)
			n++
		}
	}
	if acc&(1<<bits-1) != 0 {
		return [32]byte{}, errNpub
	}
	return key, nil
}

func bech32Polymod(values []byte) uint32 {
	generator := [5]uint32{0x3b6a57b2, 0x26508e6d, 0x1ea119fa, 0x3d4233dd, 0x2a1462b3}
	chk := uint32(1)
	for _, v := range values {
		top := chk >> 25
		chk = (chk&0x1ffffff)<<5 ^ uint32(v)
		for i := range 5 {
			if top>>i&1 == 1 {
				chk ^= generator[i]
			}
		}
	}
	return chk
}

// EncodeNpub returns the NIP-19 npub form of a 32-byte public key.
func EncodeNpub(key []byte) string {
	const hrp = "npub"
	var groups []byte
	acc, bits := 0, 0
	for _, b := range key {
		acc = acc<<8 | int(b)
		bits += 8
		for bits >= 5 {
			bits -= 5
			groups = append(groups, byte(acc>>bits&31))
		}
	}
	if bits > 0 {
		groups = append(groups, byte(acc<<(5-bits)&31))
	}
	values := append(hrpExpand(hrp, len(groups)+6), groups...)
	mod := bech32Polymod(append(values, 0, 0, 0, 0, 0, 0)) ^ 1
	out := make([]byte, 0, len(hrp)+1+len(groups)+6)
	out = append(out, hrp...)
	out = append(out, '1')
	for _, g := range groups {
		out = append(out, bech32Charset[g])
	}
	for i := range 6 {
		out = append(out, bech32Charset[mod>>(5*(5-i))&31])
	}
	return string(out)
}

// hrpExpand is the checksum's prefix for hrp, with room for n more values.
func hrpExpand(hrp string, n int) []byte {
	values := make([]byte, 0, 2*len(hrp)+1+n)
	for i := 0; i < len(hrp); i++ {
		values = append(values, hrp[i]>>5)
	}
	values = append(values, 0)
	for i := 0; i < len(hrp); i++ {
		values = append(values, hrp[i]&31)
	}
	return values
}
