package deletion

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"slices"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/media"
)

// Inventory is what an operator approves: the community-scoped catalog
// (with row counts, observational only) and a summary of every object key
// the community owns. Its digest binds the approval.
type Inventory struct {
	Schema  SchemaManifest  `json:"schema"`
	Storage StorageManifest `json:"storage"`
}

// SchemaManifest is the catalog the deletion was approved against.
type SchemaManifest struct {
	ScopedTables []string     `json:"scoped_tables"`
	RowCounts    []TableCount `json:"row_counts"`
	FencedTables []string     `json:"fenced_tables"`
}

// TableCount is one table's rows of the community.
type TableCount struct {
	Table string `json:"table"`
	Rows  int64  `json:"rows"`
}

// StorageManifestVersion is the manifest encoding this code writes and
// reads: plain keys (the media store is not versioned).
const StorageManifestVersion = 4

// StorageManifest summarises keys per prefix, strictly sorted by prefix.
type StorageManifest struct {
	Version  int              `json:"version"`
	Prefixes []PrefixManifest `json:"prefixes"`
	// MediaStore says whether the inventory listed a media store
	// (MediaStoreListed) or was taken without one (MediaStoreNone); empty in
	// inventories from before it was recorded. An executor must run with
	// the same, or the approved counts would not describe what it deletes.
	MediaStore string `json:"media_store,omitempty"`
}

// Values of StorageManifest.MediaStore.
const (
	MediaStoreListed = "listed"
	MediaStoreNone   = "none"
)

// mediaStoreState is the MediaStore value for store.
func mediaStoreState(store media.Store) string {
	if store == nil {
		return MediaStoreNone
	}
	return MediaStoreListed
}

// Key classes of a manifest prefix.
const (
	ClassBinding    = "binding"     // the community's own object
	ClassSharedBlob = "shared_blob" // deleted only when no other community references it
)

// SharedBlobPrefix is the manifest prefix of shared blob candidates: blob
// keys sit at the top of the store.
const SharedBlobPrefix = ""

// PrefixManifest is one prefix's key count, bytes and key digest.
type PrefixManifest struct {
	Prefix      string `json:"prefix"`
	Class       string `json:"class"`
	ObjectCount int64  `json:"object_count"`
	TotalBytes  int64  `json:"total_bytes"`
	KeysDigest  string `json:"keys_digest"`
}

// Digest is SHA-256 over the canonical encoding: struct fields in
// declaration order, slices in their (sorted) order, no whitespace. It is
// always recomputed from the decoded value, never from stored JSONB text
// (JSONB reorders object keys).
func (inv Inventory) Digest() ([]byte, error) {
	raw, err := json.Marshal(inv)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(raw)
	return sum[:], nil
}

// DecodeInventory reads a stored inventory and checks its shape.
func DecodeInventory(raw []byte) (Inventory, error) {
	var inv Inventory
	if err := json.Unmarshal(raw, &inv); err != nil {
		return Inventory{}, permanent("inventory does not decode: %v", err)
	}
	return inv, inv.Storage.Validate()
}

// Validate fails closed on any manifest this code did not write: unknown
// version, unsorted or duplicate prefixes, a malformed digest.
func (m StorageManifest) Validate() error {
	if m.Version != StorageManifestVersion {
		return permanent("storage manifest version %d is not %d", m.Version, StorageManifestVersion)
	}
	for i, p := range m.Prefixes {
		if i > 0 && m.Prefixes[i-1].Prefix >= p.Prefix {
			return permanent("storage manifest prefixes are not strictly sorted at %q", p.Prefix)
		}
		if p.Prefix == "" && p.Class != ClassSharedBlob {
			return permanent("storage manifest has an empty binding prefix (the whole store)")
		}
		if p.Class != ClassBinding && p.Class != ClassSharedBlob {
			return permanent("storage manifest prefix %q has unknown class %q", p.Prefix, p.Class)
		}
		if d, err := hex.DecodeString(p.KeysDigest); err != nil || len(d) != sha256.Size || hex.EncodeToString(d) != p.KeysDigest {
			return permanent("storage manifest prefix %q has a malformed digest", p.Prefix)
		}
		if p.ObjectCount < 0 || p.TotalBytes < 0 {
			return permanent("storage manifest prefix %q has negative counts", p.Prefix)
		}
	}
	return nil
}

// keyDigest hashes a strictly ascending key stream, key + "\n" each, so the
// digest does not depend on how the keys were chunked.
type keyDigest struct {
	h     hash.Hash
	last  string
	count int64
	bytes int64
}

func newKeyDigest() *keyDigest { return &keyDigest{h: sha256.New()} }

func (d *keyDigest) add(key string, size int64) error {
	if d.count > 0 && key <= d.last {
		return permanent("key %q is out of order or repeated after %q", key, d.last)
	}
	d.h.Write([]byte(key))
	d.h.Write([]byte{'\n'})
	d.last = key
	d.count++
	d.bytes += size
	return nil
}

func (d *keyDigest) summary(prefix, class string) PrefixManifest {
	return PrefixManifest{Prefix: prefix, Class: class, ObjectCount: d.count, TotalBytes: d.bytes,
		KeysDigest: hex.EncodeToString(d.h.Sum(nil))}
}

// summarizeBindings walks the community's prefixes, checking every key has
// a known shape (an unknown key under a community prefix is a permanent
// failure: deleting what we cannot name is refused).
func summarizeBindings(ctx context.Context, store media.Store, community uuid.UUID) ([]PrefixManifest, error) {
	var out []PrefixManifest
	for _, prefix := range media.CommunityPrefixes(community) {
		d := newKeyDigest()
		if store != nil {
			err := store.Walk(ctx, prefix, "", func(key string, size int64) error {
				if _, _, ok := media.ClassifyCommunityKey(community, key); !ok {
					return permanent("unknown object key shape under %s: %q", prefix, key)
				}
				return d.add(key, size)
			})
			if err != nil {
				return nil, fmt.Errorf("list %s: %w", prefix, err)
			}
		}
		out = append(out, d.summary(prefix, ClassBinding))
	}
	return out, nil
}

func sortedCopy(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
