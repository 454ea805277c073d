package repocheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	// testDefinition is a test, benchmark or fuzz target's declaration.
	testDefinition = regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz)[A-Z][A-Za-z0-9_]*)\(`)
	testMention    = regexp.MustCompile(`\b(?:Test|Benchmark|Fuzz)[A-Z][A-Za-z0-9_]*`)
)

// Every test, benchmark or fuzz target README.md and docs/*.md name is
// declared somewhere in the repository: a doc that says "pinned by TestX"
// points a reader at a test that still exists under that name.
// Mutation killed: a cited test renamed (or deleted) in the code and not
// in the doc.
func TestDocsCiteTestsThatExist(t *testing.T) {
	t.Parallel()
	declared := map[string]bool{}
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "../.." && skipDirs[d.Name()] {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range testDefinition.FindAllStringSubmatch(string(src), -1) {
			declared[m[1]] = true
		}
		return nil
	})
	require.NoError(t, err)
	require.True(t, declared["TestDocsCiteTestsThatExist"], "the walk finds the test declarations")

	docs, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	var missing []string
	cited := 0
	for _, path := range append(docs, "../../README.md") {
		text, err := os.ReadFile(path)
		require.NoError(t, err)
		for _, name := range testMention.FindAllString(string(text), -1) {
			cited++
			if !declared[name] {
				missing = append(missing, name+" ("+filepath.Base(path)+")")
			}
		}
	}
	require.Greater(t, cited, 50, "the docs' test citations are still found")
	slices.Sort(missing)
	require.Empty(t, slices.Compact(missing), "the docs cite tests that no _test.go declares")
}
