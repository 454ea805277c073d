package nostr_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// A NIP-98 header names the URL and method, binds a body by its hash and
// only a body, carries a nonce (two headers of one second differ), and is
// signed by the key. Mutations killed: a payload tag for a nil body; no
// nonce (the two headers are equal).
func TestHTTPAuthHeader(t *testing.T) {
	t.Parallel()
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	now := time.Unix(1_800_000_000, 0)
	decode := func(header string) *nostr.Event {
		t.Helper()
		token, ok := strings.CutPrefix(header, "Nostr ")
		require.True(t, ok, header)
		raw, err := base64.StdEncoding.DecodeString(token)
		require.NoError(t, err)
		var ev nostr.Event
		require.NoError(t, ev.UnmarshalJSON(raw))
		require.NoError(t, ev.Verify())
		return &ev
	}

	body := []byte(`{"pubkeys":[]}`)
	post, err := nostr.HTTPAuthHeader(key, "POST", "https://relay.example/x", body, now)
	require.NoError(t, err)
	ev := decode(post)
	sum := sha256.Sum256(body)
	require.Equal(t, nostr.KindHTTPAuth, ev.Kind)
	require.Equal(t, now.Unix(), ev.CreatedAt)
	require.Equal(t, key.PublicKeyHex(), ev.PubKey)
	require.Equal(t, []string{"https://relay.example/x"}, ev.Tags.Values("u"))
	require.Equal(t, []string{"POST"}, ev.Tags.Values("method"))
	require.Equal(t, []string{hex.EncodeToString(sum[:])}, ev.Tags.Values("payload"))
	require.Len(t, ev.Tags.Values("nonce"), 1)

	get, err := nostr.HTTPAuthHeader(key, "GET", "https://relay.example/x", nil, now)
	require.NoError(t, err)
	first := decode(get)
	require.Empty(t, first.Tags.Values("payload"), "no body, no payload tag")
	again, err := nostr.HTTPAuthHeader(key, "GET", "https://relay.example/x", nil, now)
	require.NoError(t, err)
	require.NotEqual(t, first.ID, decode(again).ID, "the nonce tells two requests of one second apart")
}
