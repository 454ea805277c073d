package nostr

import (
	"encoding/json"
	"strings"
	"testing"
)

// benchEvent is a typical kind-1 reply: a few tags and a tweet-sized note.
func benchEvent(b *testing.B) *Event {
	sk, err := SecretKeyFromHex(testSK1)
	if err != nil {
		b.Fatal(err)
	}
	e := &Event{
		CreatedAt: 1700000000,
		Kind:      1,
		Tags: Tags{
			{"e", hexA, "wss://relay.example.com", "root"},
			{"e", hexC, "wss://relay.example.com", "reply"},
			{"p", hexB},
			{"p", hexC},
			{"t", "nostr"},
		},
		Content: strings.Repeat("GM nostr! \"quoted\" <b>bold</b> & emoji 🤙\n", 6),
	}
	if err := e.Sign(sk); err != nil {
		b.Fatal(err)
	}
	return e
}

func BenchmarkParseEventMessage(b *testing.B) {
	e := benchEvent(b)
	msg := EncodeEvent("x", e)
	msg = append([]byte(`["EVENT",`), msg[len(`["EVENT","x",`):]...)
	lim := DefaultLimits()
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseClientMessage(msg, lim); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseEventMessageStdlib is a reference point: encoding/json into
// plain structs, with none of our validation.
func BenchmarkParseEventMessageStdlib(b *testing.B) {
	type plain struct {
		ID        string     `json:"id"`
		PubKey    string     `json:"pubkey"`
		CreatedAt int64      `json:"created_at"`
		Kind      int        `json:"kind"`
		Tags      [][]string `json:"tags"`
		Content   string     `json:"content"`
		Sig       string     `json:"sig"`
	}
	e := benchEvent(b)
	raw, _ := e.MarshalJSON()
	msg := append(append([]byte(`["EVENT",`), raw...), ']')
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		var arr []json.RawMessage
		var ev plain
		if err := json.Unmarshal(msg, &arr); err != nil {
			b.Fatal(err)
		}
		if err := json.Unmarshal(arr[1], &ev); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerifySignature(b *testing.B) {
	e := benchEvent(b)
	b.ReportAllocs()
	for b.Loop() {
		if err := e.VerifySignature(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCheckID(b *testing.B) {
	e := benchEvent(b)
	b.ReportAllocs()
	for b.Loop() {
		if !e.CheckID() {
			b.Fatal("bad id")
		}
	}
}

func BenchmarkMarshalEvent(b *testing.B) {
	e := benchEvent(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.MarshalJSON(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFilterMatches(b *testing.B) {
	e := benchEvent(b)
	// A follow feed (500 authors, miss on the last check) plus a thread filter.
	authors := make([]string, 500)
	for i := range authors {
		authors[i] = strings.Repeat(string(hexDigits[i%16]), 63) + string(hexDigits[i/16%16])
	}
	authors[499] = e.PubKey
	since := int64(1600000000)
	fs := Filters{
		{Kinds: []int{0, 3}, Authors: authors[:10]},
		{Kinds: []int{1, 6, 7}, Authors: authors, Since: &since},
		{Kinds: []int{1}, Tags: map[string][]string{"e": {hexC}}},
	}
	b.ReportAllocs()
	for b.Loop() {
		if !fs.Matches(e) {
			b.Fatal("no match")
		}
	}
}

// BenchmarkSchnorrVerifiers times each compiled-in verifier on one digest
// (the pubkey cache warm, as for a returning author): run with
// -tags system_libsecp256k1 to see the native one beside btcec.
func BenchmarkSchnorrVerifiers(b *testing.B) {
	sk, err := SecretKeyFromHex(testSK1)
	if err != nil {
		b.Fatal(err)
	}
	pub, digest := sk.PublicKey(), [32]byte{1, 2, 3}
	sig := signDeterministic(b, sk, digest)
	for name, verify := range verifiersUnderTest {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := verify(&pub, &digest, &sig); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
