package nostr

import (
	"testing"

	gonostr "github.com/nbd-wtf/go-nostr"
	"github.com/stretchr/testify/require"
)

// Fixed keys keep failures reproducible.
const (
	testSK1 = "5c0c523f52a5b6fad39ed2403092df8cebc36318b39383bca6c00808626fab3a"
	testSK2 = "0000000000000000000000000000000000000000000000000000000000000003"
)

func toGoNostr(e *Event) gonostr.Event {
	tags := make(gonostr.Tags, len(e.Tags))
	for i, t := range e.Tags {
		tags[i] = gonostr.Tag(t)
	}
	return gonostr.Event{
		ID: e.ID, PubKey: e.PubKey, CreatedAt: gonostr.Timestamp(e.CreatedAt),
		Kind: e.Kind, Tags: tags, Content: e.Content, Sig: e.Sig,
	}
}

func fromGoNostr(g *gonostr.Event) *Event {
	tags := make(Tags, len(g.Tags))
	for i, t := range g.Tags {
		tags[i] = Tag(t)
	}
	return &Event{
		ID: g.ID, PubKey: g.PubKey, CreatedAt: int64(g.CreatedAt),
		Kind: g.Kind, Tags: tags, Content: g.Content, Sig: g.Sig,
	}
}

// interopContents exercises every escaping rule.
var interopContents = []string{
	"",
	"hello world",
	"quote \" backslash \\ slash /",
	"line\nbreak\rreturn\ttab\bback\fform",
	"\x00\x01\x07\x0b\x0e\x0f\x10\x19\x1a\x1f\x7f",
	"<script>alert('x')&amp;</script>",
	"unicode: héllo 日本語 🤙 \u2028\u2029 \ufeff",
	`{"json":"inside"}`,
}

func TestInteropGoNostrSignsWeVerify(t *testing.T) {
	for i, content := range interopContents {
		g := gonostr.Event{
			CreatedAt: 1700000000 + gonostr.Timestamp(i),
			Kind:      1,
			Tags:      gonostr.Tags{{"e", "abc", "wss://r.example/<&>"}, {"t", content}},
			Content:   content,
		}
		require.NoError(t, g.Sign(testSK1))
		e := fromGoNostr(&g)

		require.Equal(t, string(g.Serialize()), string(e.Serialize()), "content %q", content)
		require.True(t, e.CheckID(), "content %q", content)
		require.NoError(t, e.VerifySignature())
		require.NoError(t, e.Verify())

		// Round trip through our wire format keeps the event intact.
		raw, err := e.MarshalJSON()
		require.NoError(t, err)
		back, err := ParseEvent(raw, DefaultLimits())
		require.NoError(t, err)
		require.Equal(t, e, back)
		require.NoError(t, back.Verify())

		// go-nostr must read our JSON as the same event.
		var g2 gonostr.Event
		require.NoError(t, g2.UnmarshalJSON(raw))
		require.Equal(t, g.ID, g2.ID)
		require.Equal(t, g.Content, g2.Content)
		ok, err := g2.CheckSignature()
		require.NoError(t, err)
		require.True(t, ok)
	}
}

func TestInteropWeSignGoNostrVerifies(t *testing.T) {
	for _, skHex := range []string{testSK1, testSK2} {
		sk, err := SecretKeyFromHex(skHex)
		require.NoError(t, err)
		gpk, err := gonostr.GetPublicKey(skHex)
		require.NoError(t, err)
		require.Equal(t, gpk, sk.PublicKeyHex())

		for i, content := range interopContents {
			e := &Event{CreatedAt: int64(i), Kind: 30023, Tags: Tags{{"d", content}}, Content: content}
			require.NoError(t, e.Sign(sk))
			require.Equal(t, sk.PublicKeyHex(), e.PubKey)
			require.True(t, e.CheckID())
			require.NoError(t, e.Verify())

			g := toGoNostr(e)
			require.True(t, g.CheckID(), "content %q", content)
			ok, err := g.CheckSignature()
			require.NoError(t, err)
			require.True(t, ok, "content %q", content)
		}
	}
}

// flipBit returns s with one bit of byte i changed, keeping it lowercase hex
// when s is hex (so the change is caught by crypto, not by syntax checks).
func flipHexChar(s string, i int) string {
	b := []byte(s)
	if b[i] == '0' {
		b[i] = '1'
	} else {
		b[i] = '0'
	}
	return string(b)
}

func TestOneBitChangesRejected(t *testing.T) {
	g := gonostr.Event{CreatedAt: 1700000000, Kind: 1, Tags: gonostr.Tags{{"p", "x"}}, Content: "gm nostr"}
	require.NoError(t, g.Sign(testSK1))
	base := fromGoNostr(&g)
	require.NoError(t, base.Verify())

	t.Run("content", func(t *testing.T) {
		e := *base
		c := []byte(e.Content)
		c[0] ^= 1
		e.Content = string(c)
		require.False(t, e.CheckID())
		require.ErrorIs(t, e.VerifySignature(), ErrBadSignature)
		require.ErrorIs(t, e.Verify(), ErrBadID)
	})
	t.Run("created_at", func(t *testing.T) {
		e := *base
		e.CreatedAt ^= 1
		require.False(t, e.CheckID())
		require.ErrorIs(t, e.VerifySignature(), ErrBadSignature)
	})
	t.Run("tag", func(t *testing.T) {
		e := *base
		e.Tags = Tags{{"p", "y"}}
		require.False(t, e.CheckID())
		require.ErrorIs(t, e.VerifySignature(), ErrBadSignature)
	})
	for _, i := range []int{0, 31, 63} {
		e := *base
		e.ID = flipHexChar(e.ID, i)
		require.False(t, e.CheckID())
		require.ErrorIs(t, e.Verify(), ErrBadID)
		// The signature is over the recomputed id, so it is still fine.
		require.NoError(t, e.VerifySignature())
	}
	for _, i := range []int{0, 63, 64, 100, 127} {
		e := *base
		e.Sig = flipHexChar(e.Sig, i)
		require.True(t, e.CheckID())
		require.ErrorIs(t, e.VerifySignature(), ErrBadSignature, "sig char %d", i)
		require.ErrorIs(t, e.Verify(), ErrBadSignature)
	}
	for _, i := range []int{0, 40, 63} {
		e := *base
		e.PubKey = flipHexChar(e.PubKey, i)
		require.ErrorIs(t, e.VerifySignature(), ErrBadSignature, "pubkey char %d", i)
	}
}

// TestKnownIDVector pins an id computed by go-nostr, so a regression shows
// up even without the cross-implementation tests.
func TestKnownIDVector(t *testing.T) {
	e := &Event{
		PubKey:    "79be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798",
		CreatedAt: 1700000000,
		Kind:      1,
		Tags:      Tags{{"e", "5c83da77af1dec6d7289834998ad7aafbd9e2191396d75ec3cc27f5a77226f36", "", "root"}, {"t", "<nostr>&"}},
		Content:   "hi \"there\"\n\t\x01 <b>&</b> 日本 🤙",
	}
	g := toGoNostr(e)
	require.Equal(t, g.GetID(), hexOf(e.ComputeID()))
	require.Equal(t, knownID, hexOf(e.ComputeID()))
	require.Equal(t,
		`[0,"79be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798",1700000000,1,`+
			`[["e","5c83da77af1dec6d7289834998ad7aafbd9e2191396d75ec3cc27f5a77226f36","","root"],["t","<nostr>&"]],`+
			`"hi \"there\"\n\t\u0001 <b>&</b> 日本 🤙"]`,
		string(e.Serialize()))
}

const knownID = "2ef4be0f5a0fabe6321c3e18504d7c7b0f2e97076fc11eee30bf9269fc8d3d17"

func hexOf(b [32]byte) string { return string(appendHex(nil, b[:])) }
