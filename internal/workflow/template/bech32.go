package template

// The npub filter needs bech32 (BIP-173) encoding; the relay otherwise never
// produces bech32, so the few lines live here rather than in a dependency.

const bech32Charset = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"

// EncodeNpub returns the NIP-19 npub form of a 32-byte public key.
func EncodeNpub(key []byte) string {
	return bech32Encode("npub", convert8to5(key))
}

func convert8to5(data []byte) []byte {
	var out []byte
	acc, bits := 0, 0
	for _, b := range data {
		acc = acc<<8 | int(b)
		bits += 8
		for bits >= 5 {
			bits -= 5
			out = append(out, byte(acc>>bits&31))
		}
	}
	if bits > 0 {
		out = append(out, byte(acc<<(5-bits)&31))
	}
	return out
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

func bech32Encode(hrp string, data []byte) string {
	values := make([]byte, 0, 2*len(hrp)+1+len(data)+6)
	for i := 0; i < len(hrp); i++ {
		values = append(values, hrp[i]>>5)
	}
	values = append(values, 0)
	for i := 0; i < len(hrp); i++ {
		values = append(values, hrp[i]&31)
	}
	values = append(values, data...)
	values = append(values, 0, 0, 0, 0, 0, 0)
	mod := bech32Polymod(values) ^ 1

	out := make([]byte, 0, len(hrp)+1+len(data)+6)
	out = append(out, hrp...)
	out = append(out, '1')
	for _, d := range data {
		out = append(out, bech32Charset[d])
	}
	for i := range 6 {
		out = append(out, bech32Charset[mod>>(5*(5-i))&31])
	}
	return string(out)
}
