// Package media keeps Blossom blobs (BUD-01/02) for every community in one
// object store. A blob is stored once under its SHA-256, whichever
// communities upload it; what ties it to a community lives under that
// community's own prefixes, so deleting a community removes exactly its
// prefixes and never another community's bytes:
//
//	{sha256}.{ext}                             the blob, shared
//	_meta/{community}/{sha256}.json            the community's sidecar: type, size, first upload
//	_uploads/{community}/{sha256}/{ULID}.json  one record per upload: who, when
package media

import (
	"context"
	"errors"
	"io"
	"time"
)

// ErrNotFound is returned by a Store for a key it does not hold, and by the
// Service for a blob the community does not have.
var ErrNotFound = errors.New("not found")

// Object is an open stored object: seekable, so ranged reads need not read
// the whole object.
type Object interface {
	io.ReadSeekCloser
}

// Info describes a stored object.
type Info struct {
	Size    int64
	ModTime time.Time
}

// Store is an object store with flat, slash-separated keys.
type Store interface {
	// Put stores size bytes of body under key, replacing any object there.
	// A reader never sees a partly written object.
	Put(ctx context.Context, key string, body io.Reader, size int64, contentType string) error
	// Open opens key for reading; ErrNotFound when absent.
	Open(ctx context.Context, key string) (Object, Info, error)
	// Stat describes key; ErrNotFound when absent.
	Stat(ctx context.Context, key string) (Info, error)
	// Delete removes key; an absent key is not an error.
	Delete(ctx context.Context, key string) error
	// List returns every key under prefix, at any depth.
	List(ctx context.Context, prefix string) ([]string, error)
	// Children returns the names of the immediate "directories" under
	// prefix (which ends with a slash): for "_meta/" the community IDs
	// that have at least one sidecar.
	Children(ctx context.Context, prefix string) ([]string, error)
	// Check reports whether the store can serve: its directory or bucket
	// exists and answers.
	Check(ctx context.Context) error
	// Walk calls fn for every key under prefix (which ends with a slash;
	// "" is the whole store) that sorts after after ("" for all), in
	// ascending byte order of the keys ("a-b" < "a.b" < "a/b"), with its
	// size, holding at most one listing page in memory whatever the prefix
	// holds. It starts at after rather than reading past the keys before
	// it, so a walk resumed from where a bounded one stopped costs what it
	// visits. An error from fn stops the walk and is returned.
	Walk(ctx context.Context, prefix, after string, fn func(key string, size int64) error) error
	// DeleteKeys removes keys in as few requests as the store allows.
	// deleted counts keys removed now; missing counts keys already absent
	// (a store that cannot tell them apart counts every key as deleted).
	// A key that could not be deleted is an error.
	DeleteKeys(ctx context.Context, keys []string) (deleted, missing int, err error)
	// PruneEmpty removes what is left of prefix (which ends with a slash)
	// once its keys are deleted: a filesystem's empty directories. Only a
	// community's deletion calls it, with the community fenced.
	PruneEmpty(ctx context.Context, prefix string) error
}
