package nostr

import (
	"sync"

	"github.com/btcsuite/btcd/btcec/v2"
	"github.com/btcsuite/btcd/btcec/v2/schnorr"
)

// pubKeyCacheSize bounds each verifier's cache of parsed keys.
const pubKeyCacheSize = 1 << 14

// pureGoKeys caches keys lifted by btcec for the pure-Go verifier.
var pureGoKeys = pubKeyCache[*btcec.PublicKey]{max: pubKeyCacheSize, lift: schnorrParsePubKey}

func schnorrParsePubKey(pk [32]byte) (*btcec.PublicKey, error) { return schnorr.ParsePubKey(pk[:]) }

// pubKeyCache caches parsed public keys: lifting an x-only key to a point
// computes a square root (about a tenth of a verification), and a relay sees
// the same authors over and over. The cache is bounded; when full it starts
// over rather than tracking recency, which keeps the hot path to one map
// lookup. K is the verifier's own parsed form of a key.
type pubKeyCache[K any] struct {
	mu   sync.RWMutex
	max  int
	lift func([32]byte) (K, error)
	keys map[[32]byte]K
}

func (c *pubKeyCache[K]) parse(pk [32]byte) (K, error) {
	c.mu.RLock()
	key, ok := c.keys[pk]
	c.mu.RUnlock()
	if ok {
		return key, nil
	}
	key, err := c.lift(pk)
	if err != nil {
		return key, err
	}
	c.mu.Lock()
	if c.keys == nil || len(c.keys) >= c.max {
		c.keys = make(map[[32]byte]K, 1024)
	}
	c.keys[pk] = key
	c.mu.Unlock()
	return key, nil
}
