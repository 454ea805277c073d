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

// The Makefile wraps tests and generation in the test cluster command, which
// lives beside dbtest, the package it serves: the path the Makefile names
// must exist there, or `make test` breaks on a move.
func TestMakefileRunsWithclusterBesideDBTest(t *testing.T) {
	t.Parallel()
	makefile, err := os.ReadFile("../../Makefile")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^WITH_PG := \$\(GO\) run \./(\S+) --$`).FindSubmatch(makefile)
	require.NotNil(t, m, "the Makefile defines WITH_PG")
	dir := string(m[1])
	require.Equal(t, "internal/dbtest/withcluster", dir)
	require.FileExists(t, filepath.Join("../..", dir, "main.go"))
}

// A fresh machine has Go and make only: every target that compiles with cgo
// (the race detector, libsecp256k1) or starts PostgreSQL or redis-server
// installs what it lacks first, so `make run` and `make test` need no step
// by hand. A new target of that kind belongs in this list.
func TestMakeTargetsInstallWhatTheyNeedFirst(t *testing.T) {
	t.Parallel()
	makefile, err := os.ReadFile("../../Makefile")
	require.NoError(t, err)
	firstPrerequisite := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^([a-z-]+):[ \t]*([a-z-]*)`).FindAllSubmatch(makefile, -1) {
		firstPrerequisite[string(m[1])] = string(m[2])
	}
	for target, deps := range map[string]string{
		"run": "deps-run", "run-replica": "deps-run", "build": "deps-run",
		"bench": "deps-run", "bench-scale": "deps-run", "test": "deps-test",
	} {
		require.Equal(t, deps, firstPrerequisite[target], "make %s", target)
	}
	ci, err := os.ReadFile("../../.ci/run")
	require.NoError(t, err)
	require.Regexp(t, `(?m)^make test$`, string(ci), ".ci/run runs the README's test command")
	require.FileExists(t, "../../.ci/deps")
}

// Every package runs under the race detector, so a test built only without
// it (a file under `//go:build !race`) runs in `make test` only if the
// Makefile names it in NORACE_TESTS, and only in NORACE_PACKAGE: one left
// out would never run in CI.
func TestUnracedTestsRunInMakeTest(t *testing.T) {
	t.Parallel()
	makefile, err := os.ReadFile("../../Makefile")
	require.NoError(t, err)
	pkg := regexp.MustCompile(`(?m)^NORACE_PACKAGE = \./(\S+)/$`).FindSubmatch(makefile)
	listed := regexp.MustCompile(`(?m)^NORACE_TESTS = (\S+)$`).FindSubmatch(makefile)
	require.NotNil(t, pkg, "the Makefile defines NORACE_PACKAGE")
	require.NotNil(t, listed, "the Makefile defines NORACE_TESTS")
	var unraced []string
	testFunc := regexp.MustCompile(`(?m)^func (Test\w+)\(`)
	err = filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil || !strings.HasPrefix(string(src), "//go:build !race\n") {
			return err
		}
		for _, m := range testFunc.FindAllStringSubmatch(string(src), -1) {
			require.Equal(t, string(pkg[1]), filepath.ToSlash(filepath.Dir(strings.TrimPrefix(path, "../../"))), "%s in %s: make test runs unraced tests of NORACE_PACKAGE only", m[1], path)
			unraced = append(unraced, m[1])
		}
		return nil
	})
	require.NoError(t, err)
	names := strings.Split(string(listed[1]), "|")
	slices.Sort(names)
	slices.Sort(unraced)
	require.Equal(t, unraced, names, "NORACE_TESTS names exactly the tests under //go:build !race")
}
