package nostr

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"time"

	"github.com/google/uuid"
)

// HTTPAuthHeader is a NIP-98 Authorization header value ("Nostr <base64
// event>") for a request of method to url, signed by key at now. A body,
// when not nil, is bound by its SHA-256 (the payload tag); a fresh nonce
// keeps two identical requests in one second from sharing an event id,
// which a replay check would refuse. extra tags are signed in too (an
// agent's owner attestation, so the relay may record it).
func HTTPAuthHeader(key *SecretKey, method, url string, body []byte, now time.Time, extra ...Tag) (string, error) {
	tags := append(Tags{{"u", url}, {"method", method}}, extra...)
	if body != nil {
		sum := sha256.Sum256(body)
		tags = append(tags, Tag{"payload", hex.EncodeToString(sum[:])})
	}
	ev := Event{Kind: KindHTTPAuth, CreatedAt: now.Unix(), Tags: append(tags, Tag{"nonce", uuid.NewString()})}
	if err := ev.Sign(key); err != nil {
		return "", err
	}
	raw, err := ev.MarshalJSON()
	if err != nil {
		return "", err
	}
	return "Nostr " + base64.StdEncoding.EncodeToString(raw), nil
}
