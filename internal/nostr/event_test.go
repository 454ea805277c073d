package nostr

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const (
	hexA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	hexB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	hexC = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
	sigX = hexA + hexB
)

func TestSerializeEscaping(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"empty", "", `""`},
		{"plain", "hello", `"hello"`},
		{"newline", "a\nb", `"a\nb"`},
		{"quote", `say "hi"`, `"say \"hi\""`},
		{"backslash", `C:\dir`, `"C:\\dir"`},
		{"cr", "a\rb", `"a\rb"`},
		{"tab", "a\tb", `"a\tb"`},
		{"backspace", "a\bb", `"a\bb"`},
		{"formfeed", "a\fb", `"a\fb"`},
		{"nul", "\x00", `"\u0000"`},
		{"other controls", "\x01\x0b\x0e\x1f", `"\u0001\u000b\u000e\u001f"`},
		{"del is raw", "\x7f", "\"\x7f\""},
		{"html stays raw", "<a href='x'>&amp;</a>", `"<a href='x'>&amp;</a>"`},
		{"slash stays raw", "a/b", `"a/b"`},
		{"non-ascii raw", "héllo 日本 🤙", `"héllo 日本 🤙"`},
		{"line separators raw", "\u2028\u2029", "\"\u2028\u2029\""},
		{"mixed", "\"\\\n<>", `"\"\\\n<>"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &Event{PubKey: hexA, CreatedAt: 1, Kind: 1, Tags: Tags{{"t", tt.in}}, Content: tt.in}
			want := `[0,"` + hexA + `",1,1,[["t",` + tt.want + `]],` + tt.want + `]`
			require.Equal(t, want, string(e.Serialize()))

			// The wire encoder uses the same escaping, and the parser reads it back.
			e.ID, e.Sig = hexB, sigX
			raw, err := e.MarshalJSON()
			require.NoError(t, err)
			require.Contains(t, string(raw), `"content":`+tt.want+`,`)
			back, err := ParseEvent(raw, Limits{})
			require.NoError(t, err)
			require.Equal(t, e, back)
		})
	}
}

func TestSerializeNilTags(t *testing.T) {
	e := &Event{PubKey: hexA, CreatedAt: 0, Kind: 0}
	require.Equal(t, `[0,"`+hexA+`",0,0,[],""]`, string(e.Serialize()))
	raw, _ := e.MarshalJSON()
	require.Equal(t, `{"id":"","pubkey":"`+hexA+`","created_at":0,"kind":0,"tags":[],"content":"","sig":""}`, string(raw))
}

func TestMarshalJSONShape(t *testing.T) {
	e := &Event{ID: hexB, PubKey: hexA, CreatedAt: 1700000000, Kind: 7,
		Tags: Tags{{"e", hexC}, {"p", hexA, "wss://x"}}, Content: "+", Sig: sigX}
	raw, err := e.MarshalJSON()
	require.NoError(t, err)
	require.Equal(t, `{"id":"`+hexB+`","pubkey":"`+hexA+`","created_at":1700000000,"kind":7,`+
		`"tags":[["e","`+hexC+`"],["p","`+hexA+`","wss://x"]],"content":"+","sig":"`+sigX+`"}`, string(raw))
	require.True(t, json.Valid(raw))

	// encoding/json finds the custom methods on *Event.
	var viaStd Event
	require.NoError(t, json.Unmarshal(raw, &viaStd))
	require.Equal(t, *e, viaStd)
	require.Equal(t, raw, e.AppendJSON(nil))
}

func TestIDHelpers(t *testing.T) {
	e := &Event{ID: strings.Repeat("ab", 32), PubKey: strings.Repeat("ff", 32), Sig: strings.Repeat("0a", 64)}
	id := e.IDBytes()
	require.Equal(t, byte(0xab), id[0])
	pk := e.PubKeyBytes()
	require.Equal(t, byte(0xff), pk[31])
	sig := e.SigBytes()
	require.Equal(t, byte(0x0a), sig[63])

	e.ID = strings.ToUpper(e.ID)
	require.Equal(t, [32]byte{}, e.IDBytes(), "uppercase is not accepted")
	e.Sig = "zz"
	require.Equal(t, [64]byte{}, e.SigBytes())

	require.True(t, IsHex64(hexA))
	require.False(t, IsHex64(hexA[:63]))
	require.False(t, IsHex64(strings.ToUpper(hexA)))
	require.False(t, IsHex64(hexA[:63]+"g"))
	require.True(t, IsLowerHex("0123456789abcdef", 16))
	require.False(t, IsLowerHex("0123456789abcdeF", 16))
	_, ok := DecodeHex32(hexA[:62] + "A0")
	require.False(t, ok)
}

func TestCheckIDRejectsMalformed(t *testing.T) {
	sk, err := SecretKeyFromHex(testSK1)
	require.NoError(t, err)
	e := &Event{Kind: 1, Content: "x"}
	require.NoError(t, e.Sign(sk))
	require.True(t, e.CheckID())

	upper := *e
	upper.ID = strings.ToUpper(e.ID)
	require.False(t, upper.CheckID(), "uppercase id is not canonical")
	require.ErrorIs(t, upper.Verify(), ErrBadID)

	short := *e
	short.ID = e.ID[:63]
	require.False(t, short.CheckID())

	badPK := *e
	badPK.PubKey = strings.ToUpper(e.PubKey)
	require.ErrorContains(t, badPK.VerifySignature(), "pubkey must be 64-char lowercase hex")

	badSig := *e
	badSig.Sig = e.Sig[:100]
	require.ErrorContains(t, badSig.VerifySignature(), "sig must be 128-char lowercase hex")

	// x = 5 is not the x coordinate of any curve point.
	offCurve := *e
	offCurve.PubKey = strings.Repeat("0", 63) + "5"
	require.ErrorContains(t, offCurve.VerifySignature(), "not a valid secp256k1 point")

	// r >= field prime is an invalid encoding.
	badR := *e
	badR.Sig = strings.Repeat("f", 64) + e.Sig[64:]
	require.ErrorContains(t, badR.VerifySignature(), "bad signature")
}

func TestSecretKey(t *testing.T) {
	sk, err := SecretKeyFromHex(testSK2)
	require.NoError(t, err)
	require.Equal(t, testSK2, sk.Hex())
	// 3*G, a well-known point.
	require.Equal(t, "f9308a019258c31049344f85f89d5229b531c845836f99b08601f113bce036f9", sk.PublicKeyHex())
	pk := sk.PublicKey()
	require.Equal(t, sk.PublicKeyHex(), hexOf(pk))

	for _, bad := range []string{
		"",
		"00",
		strings.Repeat("0", 64), // zero
		"fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141", // n
		strings.Repeat("f", 64), // > n
		strings.Repeat("g", 64),
	} {
		_, err := SecretKeyFromHex(bad)
		require.Error(t, err, bad)
	}

	gen, err := GenerateSecretKey()
	require.NoError(t, err)
	again, err := SecretKeyFromHex(gen.Hex())
	require.NoError(t, err)
	require.Equal(t, gen.PublicKeyHex(), again.PublicKeyHex())

	// Signing twice gives different signatures (fresh aux randomness), both valid.
	e1 := &Event{Kind: 1, Content: "same", CreatedAt: 5}
	e2 := &Event{Kind: 1, Content: "same", CreatedAt: 5}
	require.NoError(t, e1.Sign(gen))
	require.NoError(t, e2.Sign(gen))
	require.Equal(t, e1.ID, e2.ID)
	require.NotEqual(t, e1.Sig, e2.Sig)
	require.NoError(t, e1.Verify())
	require.NoError(t, e2.Verify())
	require.NotNil(t, e1.Tags)
}

func TestKinds(t *testing.T) {
	tests := []struct {
		kind                                         int
		regular, replaceable, ephemeral, addressable bool
	}{
		{0, false, true, false, false},
		{1, true, false, false, false},
		{3, false, true, false, false},
		{5, true, false, false, false},
		{9999, true, false, false, false},
		{10000, false, true, false, false},
		{19999, false, true, false, false},
		{20000, false, false, true, false},
		{22242, false, false, true, false},
		{29999, false, false, true, false},
		{30000, false, false, false, true},
		{39999, false, false, false, true},
		{40000, true, false, false, false},
		{65535, true, false, false, false},
	}
	for _, tt := range tests {
		require.Equal(t, tt.regular, IsRegular(tt.kind), "regular %d", tt.kind)
		require.Equal(t, tt.replaceable, IsReplaceable(tt.kind), "replaceable %d", tt.kind)
		require.Equal(t, tt.ephemeral, IsEphemeral(tt.kind), "ephemeral %d", tt.kind)
		require.Equal(t, tt.addressable, IsAddressable(tt.kind), "addressable %d", tt.kind)
	}
}

func TestTagsHelpers(t *testing.T) {
	tags := Tags{{"d"}, {"e", "1"}, {"p", "a"}, {"e", "2", "relay"}, {"d", "ident"}, {"d", "second"}}
	require.Equal(t, Tag{"e", "1"}, tags.First("e"))
	require.Equal(t, Tag{"d", "ident"}, tags.First("d"), "tags without a value are skipped")
	require.Nil(t, tags.First("x"))
	require.Equal(t, []string{"1", "2"}, tags.Values("e"))
	require.Nil(t, tags.Values("x"))
	// Has sees a flag with no value, such as NIP-29's bare ["private"].
	require.True(t, Tags{{"private"}}.Has("private"))
	require.True(t, tags.Has("p"))
	require.False(t, tags.Has("x"))
	require.False(t, Tags{{}}.Has(""), "an empty tag has no name")

	require.Equal(t, "ident", (&Event{Tags: tags}).DTag())
	require.Equal(t, "", (&Event{Tags: Tags{{"d"}}}).DTag())
	require.Equal(t, "", (&Event{}).DTag())
}
