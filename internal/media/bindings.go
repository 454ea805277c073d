package media

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
)

// What a community owns in the store, for whole-community deletion: its
// two prefixes, and (through its sidecars) references to shared blobs.

// CommunityPrefixes are the prefixes holding one community's own objects,
// in ascending order.
func CommunityPrefixes(community uuid.UUID) []string {
	return []string{"_meta/" + community.String() + "/", "_uploads/" + community.String() + "/"}
}

// KeyShape names the kind of a key under a community prefix.
type KeyShape string

const (
	ShapeSidecar KeyShape = "sidecar"
	ShapeUpload  KeyShape = "upload"
)

// ClassifyCommunityKey says which known shape key has under community's
// prefixes, and the blob hash it concerns; ok is false for anything else
// (which a deletion must refuse to guess about).
func ClassifyCommunityKey(community uuid.UUID, key string) (shape KeyShape, sha string, ok bool) {
	c := community.String()
	if rest, found := strings.CutPrefix(key, "_meta/"+c+"/"); found {
		sha, found = strings.CutSuffix(rest, ".json")
		if found && isSHA256Hex(sha) {
			return ShapeSidecar, sha, true
		}
		return "", "", false
	}
	if rest, found := strings.CutPrefix(key, "_uploads/"+c+"/"); found {
		sha, name, found := strings.Cut(rest, "/")
		ulid, isJSON := strings.CutSuffix(name, ".json")
		if found && isJSON && isSHA256Hex(sha) && isULID(ulid) {
			return ShapeUpload, sha, true
		}
	}
	return "", "", false
}

func isULID(s string) bool {
	if len(s) != 26 || s[0] > '7' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !strings.ContainsRune(crockford, rune(s[i])) {
			return false
		}
	}
	return true
}

// IsBlobKey reports whether key has the shape of a shared blob:
// {sha256}.{ext} at the top of the store.
func IsBlobKey(key string) bool {
	sha, ext, ok := strings.Cut(key, ".")
	if !ok || !isSHA256Hex(sha) || ext == "" || len(ext) > maxExtensionLen {
		return false
	}
	for i := 0; i < len(ext); i++ {
		c := ext[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// SidecarBlob reads the sidecar at key and returns the shared blob key it
// points to.
func SidecarBlob(ctx context.Context, store Store, key string) (string, error) {
	s := &Service{store: store}
	var d Descriptor
	if err := s.readJSON(ctx, key, &d); err != nil {
		return "", err
	}
	if !IsBlobKey(d.Blob) || !strings.HasPrefix(d.Blob, d.SHA256+".") {
		return "", fmt.Errorf("sidecar %s names blob %q, not a blob key of its hash", key, d.Blob)
	}
	return d.Blob, nil
}

// CommunitiesWithMedia lists the communities that have at least one
// sidecar: the only ones that can reference a blob.
func CommunitiesWithMedia(ctx context.Context, store Store) ([]uuid.UUID, error) {
	names, err := store.Children(ctx, "_meta/")
	if err != nil {
		return nil, fmt.Errorf("list communities with media: %w", err)
	}
	ids := make([]uuid.UUID, 0, len(names))
	for _, name := range names {
		if id, err := uuid.Parse(name); err == nil {
			ids = append(ids, id) // anything else is not a community's prefix
		}
	}
	return ids, nil
}

// BlobReferenced reports whether any of communities other than except (Nil:
// none excepted) has a sidecar for the blob at blobKey (or of hash blobKey).
// It costs one stat per community.
func BlobReferenced(ctx context.Context, store Store, blobKey string, communities []uuid.UUID, except uuid.UUID) (bool, error) {
	sha, _, _ := strings.Cut(blobKey, ".")
	for _, id := range communities {
		if id == except {
			continue
		}
		_, err := store.Stat(ctx, sidecarKey(id, sha))
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, ErrNotFound) {
			return false, fmt.Errorf("stat sidecar: %w", err)
		}
	}
	return false, nil
}
