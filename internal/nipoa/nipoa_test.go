package nipoa_test

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nipoa"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// The published NIP-OA test vector: owner secret 1, agent secret 2.
const (
	vectorOwnerSecret = "0000000000000000000000000000000000000000000000000000000000000001"
	vectorAgentSecret = "0000000000000000000000000000000000000000000000000000000000000002"
	vectorOwner       = "79be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798"
	vectorAgent       = "c6047f9441ed7d6d3045406e95c07cd85c778e4b8cef3ca7abac09b95c709ee5"
	vectorConditions  = "kind=1&created_at<1713957000"
	vectorDigest      = "08cdecd55af4c28d3801fd69615dcf5cc04fab3bc134b38a840bf157197069a6"
	vectorSig         = "8b7df2575caf0a108374f8471722b233c53f9ff827a8b0f91861966c3b9dd5cb2e189eae9f49d72187674c2f5bd244145e10ff86c9f257ffe65a1ee5f108b369"
	vectorTagJSON     = `["auth","` + vectorOwner + `","` + vectorConditions + `","` + vectorSig + `"]`
)

// vectorEvent is the vector's signed kind 1 event carrying the tag.
func vectorEvent() *nostr.Event {
	return &nostr.Event{
		ID:        "d892a65e7677e0554ebb70ee16deeb6a0727dba46450fb4bc001291d7bff971b",
		PubKey:    vectorAgent,
		CreatedAt: 1713956400,
		Kind:      1,
		Tags:      nostr.Tags{{"auth", vectorOwner, vectorConditions, vectorSig}},
		Content:   "owner-attested agent event",
		Sig:       "7fd38992b70b5e9e113644e51b4c8ee2227f3bdd402b1855f8786c0600394ab3ec2621742a7bad0b0000b93d4d1ae6e39525f286a3c1029f43f46c3359a6c76f",
	}
}

func TestGoldenVector(t *testing.T) {
	t.Parallel()
	owner, err := nostr.SecretKeyFromHex(vectorOwnerSecret)
	require.NoError(t, err)
	agent, err := nostr.SecretKeyFromHex(vectorAgentSecret)
	require.NoError(t, err)
	require.Equal(t, vectorOwner, owner.PublicKeyHex())
	require.Equal(t, vectorAgent, agent.PublicKeyHex())

	digest := nipoa.Digest(vectorAgent, vectorConditions)
	require.Equal(t, vectorDigest, hex.EncodeToString(digest[:]))

	a, err := nipoa.ParseHeader(vectorTagJSON)
	require.NoError(t, err)
	require.Equal(t, vectorOwner, a.Owner)
	require.Equal(t, vectorConditions, a.Conditions)
	require.NoError(t, a.VerifyFor(vectorAgent, 1713956400))
	var tag strings.Builder
	enc := json.NewEncoder(&tag)
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(a.Tag()))
	require.Equal(t, vectorTagJSON+"\n", tag.String(), "the tag round-trips byte for byte")

	got, err := nipoa.VerifyEvent(vectorEvent())
	require.NoError(t, err)
	require.Equal(t, vectorOwner, got.Owner)

	// A tag minted here verifies the same way.
	minted, err := nipoa.Sign(owner, vectorAgent, vectorConditions)
	require.NoError(t, err)
	require.NoError(t, minted.VerifyFor(vectorAgent, 1713956400))
}

// Every invalid vector NIP-OA lists, plus the grammar's other refusals.
func TestInvalidVectors(t *testing.T) {
	t.Parallel()
	owner, err := nostr.SecretKeyFromHex(vectorOwnerSecret)
	require.NoError(t, err)
	signed := func(conditions string) nostr.Tag {
		sig, err := owner.SignDigest(nipoa.Digest(vectorAgent, conditions))
		require.NoError(t, err)
		return nostr.Tag{"auth", vectorOwner, conditions, hex.EncodeToString(sig[:])}
	}
	good := nostr.Tag{"auth", vectorOwner, vectorConditions, vectorSig}
	cases := []struct {
		name string
		tags nostr.Tags
		want error
		msg  string
	}{
		{"two auth tags", nostr.Tags{good, good}, nipoa.ErrMalformed, "at most one auth tag"},
		{"two auth tags, one short", nostr.Tags{good, {"auth"}}, nipoa.ErrMalformed, "at most one auth tag"},
		{"3 elements", nostr.Tags{good[:3]}, nipoa.ErrMalformed, "exactly 4 elements"},
		{"5 elements", nostr.Tags{append(nostr.Tag{}, append(good, "extra")...)}, nipoa.ErrMalformed, "exactly 4 elements"},
		{"trailing &", nostr.Tags{signed("kind=1&")}, nipoa.ErrMalformed, "empty clause"},
		{"leading &", nostr.Tags{signed("&kind=1")}, nipoa.ErrMalformed, "empty clause"},
		{"doubled &", nostr.Tags{signed("kind=1&&created_at<5")}, nipoa.ErrMalformed, "empty clause"},
		{"leading zero", nostr.Tags{signed("kind=01")}, nipoa.ErrMalformed, "canonical decimal"},
		{"kind out of range", nostr.Tags{signed("kind=65536")}, nipoa.ErrMalformed, "canonical decimal"},
		{"timestamp out of range", nostr.Tags{signed("created_at<4294967296")}, nipoa.ErrMalformed, "canonical decimal"},
		{"signed number", nostr.Tags{signed("kind=+1")}, nipoa.ErrMalformed, "canonical decimal"},
		{"empty number", nostr.Tags{signed("created_at>")}, nipoa.ErrMalformed, "canonical decimal"},
		{"whitespace", nostr.Tags{signed("kind=1 ")}, nipoa.ErrMalformed, "without whitespace"},
		{"unknown clause", nostr.Tags{signed("kind<1")}, nipoa.ErrMalformed, "unknown condition clause"},
		{"case-sensitive clause", nostr.Tags{signed("Kind=1")}, nipoa.ErrMalformed, "unknown condition clause"},
		{"uppercase owner", nostr.Tags{{"auth", strings.ToUpper(vectorOwner), vectorConditions, vectorSig}}, nipoa.ErrMalformed, "owner must be"},
		{"short sig", nostr.Tags{{"auth", vectorOwner, vectorConditions, vectorSig[:126]}}, nipoa.ErrMalformed, "sig must be"},
		{"owner not on the curve", nostr.Tags{{"auth", strings.Repeat("f", 64), vectorConditions, vectorSig}}, nipoa.ErrRejected, "signature does not authorize"},
		{"conditions changed after signing", nostr.Tags{{"auth", vectorOwner, "created_at<1713957000&kind=1", vectorSig}}, nipoa.ErrRejected, "signature does not authorize"},
		{"kind not allowed", nostr.Tags{signed("kind=7")}, nipoa.ErrRejected, "kind=7 does not allow kind 1"},
		{"expired", nostr.Tags{signed("created_at<1713956400")}, nipoa.ErrRejected, "created_at<1713956400 does not allow"},
		{"not yet valid", nostr.Tags{signed("created_at>1713956400")}, nipoa.ErrRejected, "created_at>1713956400 does not allow"},
	}
	agent, err := nostr.SecretKeyFromHex(vectorAgentSecret)
	require.NoError(t, err)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ev := &nostr.Event{CreatedAt: 1713956400, Kind: 1, Tags: tc.tags, Content: "x"}
			require.NoError(t, ev.Sign(agent))
			a, err := nipoa.VerifyEvent(ev)
			require.Nil(t, a)
			require.ErrorIs(t, err, tc.want)
			require.Contains(t, err.Error(), tc.msg)
		})
	}

	t.Run("self-attestation", func(t *testing.T) {
		t.Parallel()
		ev := &nostr.Event{CreatedAt: 1, Kind: 1, Content: "x"}
		self, err := nipoa.Sign(owner, vectorOwner, "")
		require.NoError(t, err)
		ev.Tags = nostr.Tags{self.Tag()}
		require.NoError(t, ev.Sign(owner))
		_, err = nipoa.VerifyEvent(ev)
		require.ErrorIs(t, err, nipoa.ErrRejected)
		require.Contains(t, err.Error(), "self-attestation")
		require.ErrorIs(t, self.VerifyFor(vectorOwner, 1), nipoa.ErrRejected)
	})
	t.Run("valid tag on an event with a bad id", func(t *testing.T) {
		t.Parallel()
		ev := vectorEvent()
		ev.Content = "tampered"
		_, err := nipoa.VerifyEvent(ev)
		require.ErrorIs(t, err, nipoa.ErrRejected)
		require.ErrorIs(t, err, nostr.ErrBadID)
	})
	t.Run("valid tag on an event with a bad signature", func(t *testing.T) {
		t.Parallel()
		ev := vectorEvent()
		ev.Sig = strings.Repeat("0", 128)
		_, err := nipoa.VerifyEvent(ev)
		require.ErrorIs(t, err, nipoa.ErrRejected)
		require.ErrorIs(t, err, nostr.ErrBadSignature)
	})
	t.Run("tag for another agent", func(t *testing.T) {
		t.Parallel()
		a, err := nipoa.ParseHeader(vectorTagJSON)
		require.NoError(t, err)
		require.ErrorIs(t, a.VerifyFor(strings.Repeat("a", 64), 1713956400), nipoa.ErrRejected)
	})
}

// Authenticating events are checked against the created_at conditions only:
// kind= limits what the agent publishes, not how it authenticates.
func TestVerifyForUsesCreatedAtConditions(t *testing.T) {
	t.Parallel()
	a, err := nipoa.ParseHeader(vectorTagJSON)
	require.NoError(t, err)
	require.NoError(t, a.VerifyFor(vectorAgent, 1713956999), "kind=1 does not bind an authentication event")
	err = a.VerifyFor(vectorAgent, 1713957000)
	require.ErrorIs(t, err, nipoa.ErrRejected)
	require.Contains(t, err.Error(), "created_at<1713957000 does not allow created_at 1713957000")
	require.Error(t, a.Allows(22242, 1713956999), "full evaluation applies kind=")
}

func TestParseHeader(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{``, `null`, `{}`, `"auth"`, `["auth",1,"",""]`, vectorTagJSON + `x`, `[` + strings.Repeat(`"a",`, 3) + `"a"]`} {
		_, err := nipoa.ParseHeader(bad)
		require.ErrorIs(t, err, nipoa.ErrMalformed, "header %q", bad)
	}
	_, err := nipoa.ParseHeader(`["auth","` + vectorOwner + `","","` + vectorSig + `"]`)
	require.NoError(t, err, "an empty conditions string is well formed")
}

func TestFindWithoutTag(t *testing.T) {
	t.Parallel()
	a, err := nipoa.Find(nostr.Tags{{"p", vectorOwner}, {"relay", "wss://x"}})
	require.NoError(t, err)
	require.Nil(t, a)
}

// FuzzParse: whatever the tag, Parse never panics, and what it accepts
// round-trips through Tag unchanged and never verifies for its own owner.
func FuzzParse(f *testing.F) {
	f.Add("auth", vectorOwner, vectorConditions, vectorSig)
	f.Add("auth", vectorOwner, "", vectorSig)
	f.Add("auth", vectorOwner, "kind=1&", vectorSig)
	f.Add("auth", vectorOwner, "kind=01", vectorSig)
	f.Add("auth", vectorOwner, "created_at>0&created_at<4294967295&kind=65535", vectorSig)
	f.Add("auth", vectorOwner, "kind=1 & kind=2", vectorSig)
	f.Add("x", "", "&&", "")
	f.Fuzz(func(t *testing.T, name, owner, conditions, sig string) {
		a, err := nipoa.Parse([]string{name, owner, conditions, sig})
		if err != nil {
			require.True(t, errors.Is(err, nipoa.ErrMalformed), err.Error())
			return
		}
		require.Equal(t, nostr.Tag{name, owner, conditions, sig}, a.Tag())
		require.ErrorIs(t, a.VerifyFor(owner, 0), nipoa.ErrRejected)
		_ = a.Allows(1, 0)
	})
}

// BenchmarkVerifyFor is the cost an attestation adds to one AUTH or HTTP
// request: parse the header and verify the owner's signature.
func BenchmarkVerifyFor(b *testing.B) {
	for b.Loop() {
		a, err := nipoa.ParseHeader(vectorTagJSON)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.VerifyFor(vectorAgent, 1713956400); err != nil {
			b.Fatal(err)
		}
	}
}
