package schemadump_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/querytmpl"
	"github.com/buzzrelay/buzz/internal/schemadump"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

const repoRoot = "../.."

// TestGeneratedFilesAreFresh is `make verify` as a test: every committed
// generated file must equal what its generator produces from the current
// sources. Editing a migration, a query or a template without running
// `make generate` fails here (and in make verify's git diff).
func TestGeneratedFilesAreFresh(t *testing.T) {
	t.Run("sql/schema.sql", func(t *testing.T) {
		t.Parallel()
		dump, err := schemadump.Dump(context.Background(), dbtest.AdminURL())
		require.NoError(t, err)
		committed, err := os.ReadFile(filepath.Join(repoRoot, "sql/schema.sql"))
		require.NoError(t, err)
		require.Equal(t, string(committed), dump, "sql/schema.sql is stale: run make generate")
	})
	t.Run("queries/*.gen.sql", func(t *testing.T) {
		t.Parallel()
		templates, err := filepath.Glob(filepath.Join(repoRoot, "queries/templates/*.sql.tmpl"))
		require.NoError(t, err)
		for _, tmpl := range templates {
			rendered, err := querytmpl.Render(tmpl)
			require.NoError(t, err)
			committed, err := os.ReadFile(querytmpl.OutputPath(tmpl))
			require.NoError(t, err, "rendered file for %s is missing: run make generate", tmpl)
			require.Equal(t, string(committed), string(rendered), "%s is stale: run make generate", querytmpl.OutputPath(tmpl))
		}
	})
	t.Run("internal/db", func(t *testing.T) {
		t.Parallel()
		cmd := exec.Command("go", "tool", "sqlc", "diff")
		cmd.Dir = repoRoot
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "sqlc output is stale: run make generate\n%s", out)
	})
}
