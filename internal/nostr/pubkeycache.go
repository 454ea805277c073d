package nostr

import (
	"sync"

	"github.com/btcsuite/btcd/btcec/v2"
	"github.com/btcsuite/btcd/btcec/v2/schnorr"
)

// parsedKeys caches lifted public keys: ParsePubKey computes a square root
// (about a tenth of a verification), and a relay sees the same authors over
// and over. The cache is bounded; when full it starts over rather than
// tracking recency, which keeps the hot path to one map lookup.
var parsedKeys = pubKeyCache{max: 1 << 14}

type pubKeyCache struct {
	mu   sync.RWMutex
	max  int
	keys map[[32]byte]*btcec.PublicKey
}

func (c *pubKeyCache) parse(pk [32]byte) (*btcec.PublicKey, error) {
	c.mu.RLock()
	pub, ok := c.keys[pk]
	c.mu.RUnlock()
	if ok {
		return pub, nil
	}
	pub, err := schnorr.ParsePubKey(pk[:])
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.keys == nil || len(c.keys) >= c.max {
		c.keys = make(map[[32]byte]*btcec.PublicKey, 1024)
	}
	c.keys[pk] = pub
	c.mu.Unlock()
	return pub, nil
}
