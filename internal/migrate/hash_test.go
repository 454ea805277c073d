package migrate

import (
	"maps"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/migrations"
)

// The template databases of the test harness are keyed on Hash: any edit to
// the migration set must change it, or tests run on a stale schema.
// Mutation killed: a hash of the names alone (or of nothing) fails
// "edit one byte"; one that skips the names fails "rename".
func TestHashChangesWithEveryEdit(t *testing.T) {
	t.Parallel()
	require.Len(t, Hash(), 16)
	require.Equal(t, Hash(), hashOf(migrations.FS), "Hash covers the embedded migrations")

	base := fstest.MapFS{
		"001_a.sql": {Data: []byte("CREATE TABLE a ();")},
		"002_b.sql": {Data: []byte("CREATE TABLE b ();")},
	}
	edit := func(f func(m fstest.MapFS)) fstest.MapFS {
		m := maps.Clone(base)
		f(m)
		return m
	}
	require.Equal(t, hashOf(base), hashOf(edit(func(fstest.MapFS) {})), "the same set hashes the same")
	require.Equal(t, hashOf(base), hashOf(edit(func(m fstest.MapFS) { m["README.md"] = &fstest.MapFile{Data: []byte("notes")} })),
		"files that are not migrations do not count")
	seen := map[string]string{hashOf(base): "base"}
	for name, changed := range map[string]fstest.MapFS{
		"edit one byte": edit(func(m fstest.MapFS) { m["002_b.sql"] = &fstest.MapFile{Data: []byte("CREATE TABLE c ();")} }),
		"rename":        edit(func(m fstest.MapFS) { m["003_b.sql"] = m["002_b.sql"]; delete(m, "002_b.sql") }),
		"add":           edit(func(m fstest.MapFS) { m["003_c.sql"] = &fstest.MapFile{Data: []byte("SELECT 1;")} }),
		"remove":        edit(func(m fstest.MapFS) { delete(m, "002_b.sql") }),
		"move a statement to the other file": edit(func(m fstest.MapFS) {
			m["001_a.sql"] = &fstest.MapFile{Data: []byte("CREATE TABLE a ();CREATE TABLE b ();")}
			m["002_b.sql"] = &fstest.MapFile{Data: []byte("")}
		}),
	} {
		h := hashOf(changed)
		require.Len(t, h, 16, name)
		prev, dup := seen[h]
		require.False(t, dup, "%s hashes like %s", name, prev)
		seen[h] = name
	}
}
