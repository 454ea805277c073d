package repocheck

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
)

var (
	markdownLink  = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)
	fencedBlock   = regexp.MustCompile("(?s)```.*?```")
	markdownTitle = regexp.MustCompile(`(?m)^#+\s+(.+?)\s*$`)
)

// headingAnchors are the anchors GitHub gives a Markdown file's headings:
// lowercased, punctuation dropped, spaces made hyphens, repeats numbered.
func headingAnchors(text string) map[string]bool {
	anchors, seen := map[string]bool{}, map[string]int{}
	for _, m := range markdownTitle.FindAllStringSubmatch(fencedBlock.ReplaceAllString(text, ""), -1) {
		slug := strings.Map(func(r rune) rune {
			switch {
			case r == ' ':
				return '-'
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				return unicode.ToLower(r)
			}
			return -1
		}, m[1])
		if n := seen[slug]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors
}

// Every relative link in README.md and docs/*.md names a file of the
// repository and, with a #fragment, a heading of that file: a reader who
// follows one never lands nowhere.
// Mutations killed: a linked doc renamed; a linked heading reworded
// (README's errors.md#http link once the heading is "## HTTP bridge").
func TestDocLinksResolve(t *testing.T) {
	t.Parallel()
	docs, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	var broken []string
	checked := 0
	for _, path := range append(docs, "../../README.md") {
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		for _, m := range markdownLink.FindAllStringSubmatch(fencedBlock.ReplaceAllString(string(raw), ""), -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			file, fragment, _ := strings.Cut(link, "#")
			target := path
			if file != "" {
				target = filepath.Join(filepath.Dir(path), file)
			}
			checked++
			text, err := os.ReadFile(target)
			if err != nil {
				broken = append(broken, fmt.Sprintf("%s: %s (no such file)", path, link))
				continue
			}
			if fragment != "" && strings.HasSuffix(target, ".md") && !headingAnchors(string(text))[fragment] {
				broken = append(broken, fmt.Sprintf("%s: %s (no such heading)", path, link))
			}
		}
	}
	require.Greater(t, checked, 20, "the links are still found")
	require.Empty(t, broken)
}
