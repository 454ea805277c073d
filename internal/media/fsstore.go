package media

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// FSStore keeps objects as files under a directory; a key's slashes are
// subdirectories. Partial writes live in tmpDir, outside every key's
// directory, so a crash mid-write leaves nothing under a community's
// prefixes.
type FSStore struct {
	root string
}

// NewFSStore uses dir (created if missing) as the store's root, and
// removes the partial writes a process killed mid-write left behind.
func NewFSStore(dir string) (*FSStore, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("media directory %s: %w", dir, err)
	}
	s := &FSStore{root: dir}
	s.removeAbandonedWrites(time.Now().Add(-abandonedWriteAge))
	return s, nil
}

// abandonedWriteAge is how old a partial write must be before a starting
// store removes it: far beyond any write still in progress (a write is
// bounded by its request's timeout), in this process or another sharing
// the directory.
const abandonedWriteAge = time.Hour

// removeAbandonedWrites removes the files in tmpDir last written before
// cutoff. A Put renames its file into place or removes it when it returns,
// but a process killed meanwhile (kill -9, out of memory) leaves it, up to
// a whole blob each, for good.
func (s *FSStore) removeAbandonedWrites(cutoff time.Time) {
	entries, err := os.ReadDir(filepath.Join(s.root, tmpDir))
	if err != nil {
		return // none yet, or unreadable: Put reports that
	}
	for _, e := range entries {
		if info, err := e.Info(); err == nil && info.Mode().IsRegular() && info.ModTime().Before(cutoff) {
			os.Remove(filepath.Join(s.root, tmpDir, e.Name()))
		}
	}
}

// Check reports whether the root is still a directory.
func (s *FSStore) Check(context.Context) error {
	info, err := os.Stat(s.root)
	if err != nil {
		return fmt.Errorf("media directory: %w", err)
	}
	if !info.IsDir() {
		return fmt.Errorf("media directory %s is not a directory", s.root)
	}
	return nil
}

// path maps a key to its file; keys are built by this package, but a key
// that could leave the root is refused anyway.
func (s *FSStore) path(key string) (string, error) {
	if key == "" || !filepath.IsLocal(filepath.FromSlash(key)) {
		return "", fmt.Errorf("media: key %q is not a local path", key)
	}
	return filepath.Join(s.root, filepath.FromSlash(key)), nil
}

// tmpDir holds partial writes, on the store's filesystem so the final
// rename is atomic; no key starts with a dot.
const tmpDir = ".tmp"

// Put writes to a temporary file and renames it into place, so a reader
// sees the old object or the whole new one.
func (s *FSStore) Put(ctx context.Context, key string, body io.Reader, size int64, contentType string) error {
	p, err := s.path(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		return err
	}
	tmpDir := filepath.Join(s.root, tmpDir)
	if err := os.MkdirAll(tmpDir, 0o750); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(tmpDir, "put-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename there is nothing to remove
	n, err := io.Copy(tmp, body)
	if err == nil && n != size {
		err = fmt.Errorf("media: wrote %d bytes of %s, want %d", n, key, size)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), p)
}

// Open opens the file for reading.
func (s *FSStore) Open(ctx context.Context, key string) (Object, Info, error) {
	p, err := s.path(key)
	if err != nil {
		return nil, Info{}, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, Info{}, ErrNotFound
	}
	if err != nil {
		return nil, Info{}, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, Info{}, err
	}
	return f, Info{Size: st.Size(), ModTime: st.ModTime()}, nil
}

// Stat describes the file.
func (s *FSStore) Stat(ctx context.Context, key string) (Info, error) {
	p, err := s.path(key)
	if err != nil {
		return Info{}, err
	}
	st, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, ErrNotFound
	}
	if err != nil {
		return Info{}, err
	}
	return Info{Size: st.Size(), ModTime: st.ModTime()}, nil
}

// Delete removes the file; directories it leaves empty stay (they cost
// nothing and removing them would race a concurrent Put into them).
func (s *FSStore) Delete(ctx context.Context, key string) error {
	p, err := s.path(key)
	if err != nil {
		return err
	}
	// A key under a name that is a file (ENOTDIR) is absent too.
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
		return err
	}
	return nil
}

// List walks the directory the prefix names (prefixes used here always end
// at a slash) and returns the keys of its files, temporary ones excluded.
func (s *FSStore) List(ctx context.Context, prefix string) ([]string, error) {
	dir := s.root
	if prefix != "" {
		var err error
		if dir, err = s.path(strings.TrimSuffix(prefix, "/")); err != nil {
			return nil, err
		}
	}
	var keys []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			if p == filepath.Join(s.root, tmpDir) {
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(s.root, p)
		if err != nil {
			return err
		}
		keys = append(keys, filepath.ToSlash(rel))
		return nil
	})
	return keys, err
}

// Walk visits the prefix's directory tree depth first. A directory's
// entries are sorted as the keys they begin, a subdirectory's name with its
// slash, so the walk is in ascending key order whatever the names ("a-b",
// "a.b", then the keys under "a/"). An entry that sorts before after is
// passed without a stat, a subdirectory whose every key does without being
// opened. A directory's names are the only listing held in memory (as bare
// strings: the root holds one entry per blob, a community's upload
// directory one per blob it uploaded).
func (s *FSStore) Walk(ctx context.Context, prefix, after string, fn func(key string, size int64) error) error {
	dir := s.root // the whole store
	if prefix != "" {
		var err error
		if dir, err = s.path(strings.TrimSuffix(prefix, "/")); err != nil {
			return err
		}
	}
	return s.walkDir(ctx, dir, prefix, after, fn)
}

// walkDir walks dir, whose keys begin with keyPrefix ("" or ending with a
// slash).
func (s *FSStore) walkDir(ctx context.Context, dir, keyPrefix, after string, fn func(key string, size int64) error) error {
	names, err := sortedEntries(dir)
	if err != nil {
		return err
	}
	for i, name := range names {
		names[i] = "" // let the walked part of a huge listing go
		if err := ctx.Err(); err != nil {
			return err
		}
		key := keyPrefix + name
		if sub, isDir := strings.CutSuffix(name, "/"); isDir {
			if strings.HasPrefix(sub, ".") {
				continue // partial writes
			}
			// Every key under key sorts before after unless after is
			// beyond it or inside it.
			if key < after && !strings.HasPrefix(after, key) {
				continue
			}
			if err := s.walkDir(ctx, filepath.Join(dir, sub), key, after, fn); err != nil {
				return err
			}
			continue
		}
		if key <= after {
			continue
		}
		info, err := os.Lstat(filepath.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted while walking
		}
		if err != nil {
			return err
		}
		if info.IsDir() { // replaced by a directory while walking
			continue
		}
		if err := fn(key, info.Size()); err != nil {
			return err
		}
	}
	return nil
}

// sortedEntries lists dir's entries in key order: a subdirectory's name
// ends with a slash, which sorts it after the names it begins with a dash
// or a dot, as its keys do. Entries are read a chunk at a time and kept as
// bare strings. A missing dir has none.
func sortedEntries(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var names []string
	for {
		entries, err := f.ReadDir(1024)
		for _, e := range entries {
			name := e.Name()
			if e.IsDir() {
				name += "/"
			}
			names = append(names, name)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	slices.Sort(names)
	return names, nil
}

// DeleteKeys removes each file, telling removed from already absent.
func (s *FSStore) DeleteKeys(ctx context.Context, keys []string) (deleted, missing int, err error) {
	for _, key := range keys {
		if err := ctx.Err(); err != nil {
			return deleted, missing, err
		}
		p, err := s.path(key)
		if err != nil {
			return deleted, missing, err
		}
		switch err := os.Remove(p); {
		case err == nil:
			deleted++
		case errors.Is(err, fs.ErrNotExist):
			missing++
		default:
			return deleted, missing, err
		}
	}
	return deleted, missing, nil
}

// PruneEmpty removes the prefix's directory and every directory below it
// that holds no file, deepest first. Delete leaves a blob's directories
// behind (removing them there would race an upload into them), and a
// community's deletion removes only the files it lists: left behind, a
// deleted community kept a directory named for the SHA-256 of every blob
// it had uploaded, and CommunitiesWithMedia listed it for good. Only a
// community's deletion calls this, once its keys are gone and the
// community is fenced, so nothing writes there meanwhile. Like Walk, it
// holds one directory's listing at a time.
func (s *FSStore) PruneEmpty(ctx context.Context, prefix string) error {
	dir, err := s.path(strings.TrimSuffix(prefix, "/"))
	if err != nil {
		return err
	}
	return pruneEmptyDirs(ctx, dir)
}

func pruneEmptyDirs(ctx context.Context, dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		if e.IsDir() {
			if err := pruneEmptyDirs(ctx, filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	switch err := os.Remove(dir); {
	case err == nil, errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EEXIST):
		return nil // gone, or holds a file (which the deletion's verification then finds)
	default:
		return err
	}
}

// Children lists the subdirectories of the prefix's directory.
func (s *FSStore) Children(ctx context.Context, prefix string) ([]string, error) {
	dir, err := s.path(strings.TrimSuffix(prefix, "/"))
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	return names, nil
}
