package media

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const testSHA = "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"

// Mutations killed: accepting 63 or 65 digits, non-hex digits, an empty or
// over-long extension, path separators in the extension; not lowercasing
// an uppercase hash.
func TestParseBlobName(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]struct {
		sha, ext string
		ok       bool
	}{
		testSHA:                                 {testSHA, "", true},
		testSHA + ".png":                        {testSHA, "png", true},
		strings.ToUpper(testSHA) + ".JPG":       {testSHA, "JPG", true},
		testSHA[:63]:                            {},
		testSHA + "0":                           {},
		"g" + testSHA[1:]:                       {},
		testSHA + ".":                           {},
		testSHA + ".png.exe":                    {},
		testSHA + "./..":                        {},
		testSHA + "." + strings.Repeat("a", 17): {},
		"upload":                                {},
		"":                                      {},
	} {
		sha, ext, ok := ParseBlobName(name)
		require.Equal(t, want.ok, ok, name)
		require.Equal(t, want.sha, sha, name)
		require.Equal(t, want.ext, ext, name)
	}
}

// Whatever the input, an accepted name yields a key-safe hash and
// extension: the hash is exactly what a key may contain.
func FuzzParseBlobName(f *testing.F) {
	f.Add(testSHA)
	f.Add(testSHA + ".png")
	f.Add(testSHA + "./../x")
	f.Add("../../etc/passwd")
	f.Fuzz(func(t *testing.T, name string) {
		sha, ext, ok := ParseBlobName(name)
		if !ok {
			return
		}
		if !isSHA256Hex(sha) {
			t.Fatalf("%q: hash %q is not 64 lowercase hex", name, sha)
		}
		if len(ext) > maxExtensionLen || strings.ContainsAny(ext, "./\\\x00") {
			t.Fatalf("%q: extension %q is not key-safe", name, ext)
		}
		if !strings.EqualFold(name, sha+map[bool]string{true: "." + ext, false: ""}[ext != ""]) {
			t.Fatalf("%q: parsed as %q + %q", name, sha, ext)
		}
	})
}

// Mutations killed: lowercase or non-Crockford digits, a wrong length, the
// time not leading (records would not list oldest first).
func TestNewULID(t *testing.T) {
	t.Parallel()
	at := time.UnixMilli(1_700_000_000_000)
	id := newULID(at)
	require.Len(t, id, 26)
	for _, c := range id {
		require.Contains(t, crockford, string(c))
	}
	later := newULID(at.Add(time.Millisecond))
	require.Less(t, id, later)
	require.Equal(t, "01HF", id[:4], "the millisecond time leads")
}
