package repocheck

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// outsideCitation matches references to documents that are not in the
// repository: design notes and reviews the code was once written from. A
// reader has only the repository, so every comment, migration and document
// states the reason itself (the design lives in docs/). The patterns are
// spelled so that this file does not match itself.
var outsideCitation = regexp.MustCompile(`(?i)\bspec [A-D](\.[0-9]+)?\b|\bseeds?[ -]?[0-9]{3}\b|\[ASSUMED\]|\bdecision [0-9]+\b|review[ ]finding|\([A-D]\.[0-9]+[):]|seed[ ]DB[ ]test|seed's[ ]harness`)

// skipDirs are not the project's own text: VCS data, installed packages,
// local runtime data, build output and fuzz corpora.
var skipDirs = map[string]bool{".git": true, "node_modules": true, ".data": true, "bin": true, "testdata": true}

// checkedExt are the files a reader of the project reads.
var checkedExt = map[string]bool{
	".go": true, ".sql": true, ".tmpl": true, ".md": true, ".yaml": true, ".mjs": true, ".sh": true,
}

func TestNoCitationsOfOutsideDocuments(t *testing.T) {
	t.Parallel()
	var found []string
	eachProjectLine(t, func(at, text string) {
		if outsideCitation.MatchString(text) {
			found = append(found, at+": "+strings.TrimSpace(text))
		}
	})
	if len(found) > 0 {
		t.Fatalf("these lines cite documents outside the repository; write the reason itself:\n%s", strings.Join(found, "\n"))
	}
}

// conflictMarker is a line git leaves where a merge conflict was not
// resolved (spelled so that this file does not match itself).
var conflictMarker = regexp.MustCompile(`^(<{7}|>{7}) |^={7}$`)

// A merge resolved in haste can commit git's conflict markers, which no
// compiler sees in a document or a migration's comment.
func TestNoMergeConflictMarkers(t *testing.T) {
	t.Parallel()
	var found []string
	eachProjectLine(t, func(at, text string) {
		if conflictMarker.MatchString(text) {
			found = append(found, at+": "+text)
		}
	})
	if len(found) > 0 {
		t.Fatalf("unresolved merge conflicts:\n%s", strings.Join(found, "\n"))
	}
}

// eachProjectLine calls line with "path:N" and the text of every line of
// the files a reader of the project reads.
func eachProjectLine(t *testing.T, line func(at, text string)) {
	t.Helper()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(root, "go.mod"), "the test runs from internal/repocheck")
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && skipDirs[d.Name()] {
				return filepath.SkipDir
			}
			return nil
		}
		if !checkedExt[filepath.Ext(path)] && d.Name() != "Makefile" && d.Name() != "run" && d.Name() != "deps" {
			return nil
		}
		checked++
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		rel, _ := filepath.Rel(root, path)
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
		for n := 1; sc.Scan(); n++ {
			line(rel+":"+strconv.Itoa(n), sc.Text())
		}
		return sc.Err()
	})
	require.NoError(t, err)
	require.Greater(t, checked, 100, "the walk must reach the project's files")
}
