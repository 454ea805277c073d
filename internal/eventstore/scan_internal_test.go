package eventstore

import (
	"bytes"
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
)

func TestHexStrings(t *testing.T) {
	t.Parallel()
	id, pubkey, sig := bytes.Repeat([]byte{0x01}, 32), bytes.Repeat([]byte{0xab}, 32), bytes.Repeat([]byte{0xfe}, 64)
	sig[63] = 0x07
	gotID, gotPub, gotSig := hexStrings(id, pubkey, sig)
	require.Equal(t, hex.EncodeToString(id), gotID)
	require.Equal(t, hex.EncodeToString(pubkey), gotPub)
	require.Equal(t, hex.EncodeToString(sig), gotSig)
	a, b, c := hexStrings(nil, []byte{1}, nil)
	require.Equal(t, []string{"", "01", ""}, []string{a, b, c})
}

func TestPageCapacity(t *testing.T) {
	t.Parallel()
	ids := nostr.Filter{IDs: []string{"a", "b"}}
	kinds := nostr.Filter{Kinds: []int{1}}
	filters := nostr.Filters{ids, kinds}
	require.Equal(t, 2, pageCapacity(filters, []pageBranch{{filter: 0, remaining: 500}}, 200), "a filter by ids matches at most its ids")
	require.Equal(t, 100, pageCapacity(filters, []pageBranch{{filter: 1, remaining: 100}}, 200))
	require.Equal(t, 200, pageCapacity(filters, []pageBranch{{filter: 1, remaining: 500}}, 200), "never more than a page")
	require.Equal(t, 52, pageCapacity(filters, []pageBranch{{filter: 0, remaining: 500}, {filter: 1, remaining: 50}}, 200))
	require.Equal(t, 1, pageCapacity(filters, []pageBranch{{filter: 0, remaining: 1}}, 200))
}
