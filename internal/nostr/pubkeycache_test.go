package nostr

import (
	"sync"
	"testing"

	"github.com/btcsuite/btcd/btcec/v2"
	"github.com/stretchr/testify/require"
)

// The cache must never turn a bad signature into a good one, and must hold
// under concurrent verification of one author's events.
func TestPubKeyCacheKeepsVerificationExact(t *testing.T) {
	sk, err := GenerateSecretKey()
	require.NoError(t, err)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ev := &Event{Kind: 1, CreatedAt: int64(1700000000 + i), Content: "cached", Tags: Tags{}}
			require.NoError(t, ev.Sign(sk))
			require.NoError(t, ev.Verify())
			ev.Content = "tampered after signing"
			require.ErrorIs(t, ev.VerifySignature(), ErrBadSignature)
		}()
	}
	wg.Wait()

	small := pubKeyCache[*btcec.PublicKey]{max: 2, lift: schnorrParsePubKey}
	for i := 0; i < 5; i++ {
		k, err := GenerateSecretKey()
		require.NoError(t, err)
		_, err = small.parse(k.PublicKey())
		require.NoError(t, err)
		require.LessOrEqual(t, len(small.keys), 2, "the cache stays bounded")
	}
	_, err = small.parse([32]byte{}) // x = 0 is not on the curve
	require.Error(t, err)
}
