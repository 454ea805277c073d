// Command render writes queries/*.gen.sql from queries/templates/*.sql.tmpl.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/buzzrelay/buzz/internal/querytmpl"
)

func main() {
	templates, err := filepath.Glob("queries/templates/*.sql.tmpl")
	if err != nil {
		fail(err)
	}
	for _, path := range templates {
		sql, err := querytmpl.Render(path)
		if err != nil {
			fail(fmt.Errorf("%s: %w", path, err))
		}
		if err := os.WriteFile(querytmpl.OutputPath(path), sql, 0o644); err != nil {
			fail(err)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "render:", err)
	os.Exit(1)
}
