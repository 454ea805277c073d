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
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(root, "go.mod"), "the test runs from internal/repocheck")

	var found []string
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
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
		for line := 1; sc.Scan(); line++ {
			if m := outsideCitation.FindString(sc.Text()); m != "" {
				rel, _ := filepath.Rel(root, path)
				found = append(found, rel+":"+strconv.Itoa(line)+": "+strings.TrimSpace(sc.Text()))
			}
		}
		return sc.Err()
	})
	require.NoError(t, err)
	require.Greater(t, checked, 100, "the walk must reach the project's files")
	if len(found) > 0 {
		t.Fatalf("these lines cite documents outside the repository; write the reason itself:\n%s", strings.Join(found, "\n"))
	}
}
