package media_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/media/s3test"
)

// stores are the Store implementations every store test runs against.
var stores = map[string]func(t testing.TB) media.Store{
	"fs": func(t testing.TB) media.Store {
		s, err := media.NewFSStore(t.TempDir())
		require.NoError(t, err)
		return s
	},
	"s3": func(t testing.TB) media.Store { return s3test.Store(t) },
}

// The Store contract on both stores: put, open, seek, stat, list, children,
// delete, and ErrNotFound for absent keys.
// Mutations killed: Open or Stat returning a raw not-found error instead of
// ErrNotFound; Delete failing on an absent key; Children returning keys
// rather than directory names; List missing nested keys.
func TestStoreContract(t *testing.T) {
	t.Parallel()
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := open(t)
			body := bytes.Repeat([]byte("0123456789"), 100)
			require.NoError(t, s.Put(ctx, "blob.bin", bytes.NewReader(body), int64(len(body)), "application/octet-stream"))
			require.NoError(t, s.Put(ctx, "_meta/c1/a.json", bytes.NewReader([]byte("{}")), 2, "application/json"))
			require.NoError(t, s.Put(ctx, "_meta/c2/a.json", bytes.NewReader([]byte("{}")), 2, "application/json"))
			require.NoError(t, s.Put(ctx, "_uploads/c1/a/X.json", bytes.NewReader([]byte("{}")), 2, "application/json"))

			obj, info, err := s.Open(ctx, "blob.bin")
			require.NoError(t, err)
			require.EqualValues(t, len(body), info.Size)
			_, err = obj.Seek(995, io.SeekStart)
			require.NoError(t, err)
			tail, err := io.ReadAll(obj)
			require.NoError(t, err)
			require.Equal(t, "56789", string(tail))
			require.NoError(t, obj.Close())

			st, err := s.Stat(ctx, "blob.bin")
			require.NoError(t, err)
			require.EqualValues(t, len(body), st.Size)

			_, err = s.Stat(ctx, "missing.bin")
			require.ErrorIs(t, err, media.ErrNotFound)
			_, _, err = s.Open(ctx, "missing.bin")
			require.ErrorIs(t, err, media.ErrNotFound)

			keys, err := s.List(ctx, "_meta/")
			require.NoError(t, err)
			slices.Sort(keys)
			require.Equal(t, []string{"_meta/c1/a.json", "_meta/c2/a.json"}, keys)
			all, err := s.List(ctx, "")
			require.NoError(t, err)
			require.Len(t, all, 4)

			children, err := s.Children(ctx, "_meta/")
			require.NoError(t, err)
			slices.Sort(children)
			require.Equal(t, []string{"c1", "c2"}, children)

			require.NoError(t, s.Delete(ctx, "blob.bin"))
			require.NoError(t, s.Delete(ctx, "blob.bin"), "deleting an absent key is not an error")
			_, err = s.Stat(ctx, "blob.bin")
			require.ErrorIs(t, err, media.ErrNotFound)
		})
	}
}

// Walk streams a prefix's keys in ascending order with their sizes, and
// DeleteKeys removes a batch, on both stores. Kills: a filesystem walk in
// directory order (unsorted), a walk that leaks into a sibling prefix, a
// bulk delete that stops at an absent key.
func TestStoreWalkAndDeleteKeys(t *testing.T) {
	t.Parallel()
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := open(t)
			keys := []string{"_uploads/c/b/2.json", "_uploads/c/a/1.json", "_uploads/c/a/0.json", "_uploads/c/c/9.json", "_uploads/d/a/0.json", "top.bin"}
			for i, k := range keys {
				body := strings.Repeat("x", i+1)
				require.NoError(t, s.Put(ctx, k, strings.NewReader(body), int64(len(body)), "application/json"))
			}
			var walked []string
			var sizes []int64
			require.NoError(t, s.Walk(ctx, "_uploads/c/", "", func(key string, size int64) error {
				walked = append(walked, key)
				sizes = append(sizes, size)
				return nil
			}))
			require.Equal(t, []string{"_uploads/c/a/0.json", "_uploads/c/a/1.json", "_uploads/c/b/2.json", "_uploads/c/c/9.json"}, walked)
			require.Equal(t, []int64{3, 2, 1, 4}, sizes)
			var all int
			require.NoError(t, s.Walk(ctx, "", "", func(string, int64) error { all++; return nil }))
			require.Equal(t, len(keys), all, "the whole store")
			require.NoError(t, s.Walk(ctx, "_nothing/", "", func(string, int64) error { return errors.New("called") }))

			deleted, missing, err := s.DeleteKeys(ctx, []string{"_uploads/c/a/0.json", "_uploads/c/a/gone.json", "_uploads/c/b/2.json"})
			require.NoError(t, err)
			require.Equal(t, 3, deleted+missing)
			if name == "fs" {
				require.Equal(t, 1, missing, "the filesystem tells an absent key apart")
			}
			left, err := s.List(ctx, "_uploads/")
			require.NoError(t, err)
			require.ElementsMatch(t, []string{"_uploads/c/a/1.json", "_uploads/c/c/9.json", "_uploads/d/a/0.json"}, left)
		})
	}
}

// Walk after a key returns exactly the keys that sort after it, in byte
// order, on both stores, for keys whose neighbours differ by a slash, a
// dash or a dot, for afters that are keys, directories, prefixes of keys
// or no key at all, and within a prefix; and it stops when fn says so.
// Mutations killed: after ignored; the filesystem's directories sorted by
// bare name (the keys under "a/" before "a-b"); a directory skipped whose
// keys reach past after.
func TestStoreWalkAfter(t *testing.T) {
	t.Parallel()
	keys := []string{"a/c/d", "ab", "a.b", "_m0", "a/c-d", "b/x", "a-b", "a/c.d", "_m/1", "a0", "a/b"}
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	afters := append([]string{"", "a", "a/", "a/c", "a/c/", "a/c/d0", "a.", "_", "`", "a/b0", "zz"}, keys...)
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := open(t)
			for _, k := range keys {
				require.NoError(t, s.Put(ctx, k, strings.NewReader(k), int64(len(k)), "text/plain"))
			}
			walk := func(prefix, after string) []string {
				walked := []string{}
				require.NoError(t, s.Walk(ctx, prefix, after, func(key string, size int64) error {
					require.Equal(t, int64(len(key)), size, key)
					walked = append(walked, key)
					return nil
				}))
				return walked
			}
			for _, after := range afters {
				want := []string{}
				for _, k := range sorted {
					if k > after {
						want = append(want, k)
					}
				}
				require.Equal(t, want, walk("", after), "after %q", after)
			}
			require.Equal(t, []string{"a/c.d", "a/c/d"}, walk("a/", "a/c-d"))
			require.Equal(t, []string{"a/b", "a/c-d", "a/c.d", "a/c/d"}, walk("a/", "a.b"), "after a key before the prefix")
			require.Equal(t, []string{}, walk("a/", "a0"), "after a key beyond the prefix")

			stop := errors.New("enough")
			var visited []string
			err := s.Walk(ctx, "", "a-b", func(key string, _ int64) error {
				visited = append(visited, key)
				if len(visited) == 2 {
					return stop
				}
				return nil
			})
			require.ErrorIs(t, err, stop)
			require.Equal(t, []string{"a.b", "a/b"}, visited)
		})
	}
}
