package deletion

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The key digest is strict about order and blind to chunking; the
// inventory digest is stable and 32 bytes; a storage manifest this code did
// not write fails closed; recorded errors are cut at a UTF-8 boundary.
// Kills: a digest that tolerates repeats or disorder, a manifest check
// that accepts an empty binding prefix or a bad digest.
func TestDigestsAndManifestShape(t *testing.T) {
	t.Parallel()
	d := newKeyDigest()
	require.NoError(t, d.add("a", 1))
	require.NoError(t, d.add("b", 2))
	require.ErrorIs(t, d.add("b", 0), ErrPermanent, "repeat")
	require.ErrorIs(t, d.add("a0", 0), ErrPermanent, "out of order")
	whole := newKeyDigest()
	for _, k := range []string{"a", "b", "c"} {
		require.NoError(t, whole.add(k, 0))
	}
	// The same stream fed in two "chunks" hashes the same.
	split := newKeyDigest()
	for _, chunk := range [][]string{{"a"}, {"b", "c"}} {
		for _, k := range chunk {
			require.NoError(t, split.add(k, 0))
		}
	}
	require.Equal(t, whole.summary("p/", ClassBinding), split.summary("p/", ClassBinding))
	require.Equal(t, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", newKeyDigest().summary("p/", ClassBinding).KeysDigest, "empty input")

	inv := Inventory{Schema: SchemaManifest{ScopedTables: []string{"events"}, RowCounts: []TableCount{{"events", 3}}, FencedTables: []string{"events"}},
		Storage: StorageManifest{Version: StorageManifestVersion, Prefixes: []PrefixManifest{whole.summary("_meta/x/", ClassBinding)}}}
	a, err := inv.Digest()
	require.NoError(t, err)
	b, err := inv.Digest()
	require.NoError(t, err)
	require.Len(t, a, 32)
	require.Equal(t, a, b)
	inv.Schema.RowCounts[0].Rows = 4
	c, _ := inv.Digest()
	require.NotEqual(t, a, c)

	good := whole.summary("_meta/x/", ClassBinding)
	for name, m := range map[string]StorageManifest{
		"version":      {Version: 5, Prefixes: []PrefixManifest{good}},
		"unsorted":     {Version: 4, Prefixes: []PrefixManifest{whole.summary("b/", ClassBinding), whole.summary("a/", ClassBinding)}},
		"empty prefix": {Version: 4, Prefixes: []PrefixManifest{whole.summary("", ClassBinding)}},
		"bad digest":   {Version: 4, Prefixes: []PrefixManifest{{Prefix: "a/", Class: ClassBinding, KeysDigest: strings.Repeat("Z", 64)}}},
		"class":        {Version: 4, Prefixes: []PrefixManifest{{Prefix: "a/", Class: "other", KeysDigest: good.KeysDigest}}},
	} {
		require.ErrorIs(t, m.Validate(), ErrPermanent, name)
	}
	require.NoError(t, StorageManifest{Version: 4, Prefixes: []PrefixManifest{whole.summary("", ClassSharedBlob), good}}.Validate())

	long := strings.Repeat("é", 3000) // 6000 bytes
	cut := truncateUTF8(long, maxErrorBytes)
	require.LessOrEqual(t, len(cut), maxErrorBytes)
	require.True(t, strings.HasPrefix(long, cut))
	require.Equal(t, 0, len(cut)%2, "never half a character")
	require.False(t, errors.Is(nil, ErrPermanent))
}
