package repocheck

import (
	"os"
	"path/filepath"
	"regexp"
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
