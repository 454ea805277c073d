package deletion

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/buzzrelay/buzz/internal/db"
)

// ErrCatalogUnsafe is CheckReady's finding that the catalog is unsafe, as
// opposed to a check that could not run.
var ErrCatalogUnsafe = errors.New("community deletion catalog is unsafe")

// CheckReady fails when the catalog is unsafe for community deletion:
// a community-scoped table without its write fence (named), or the
// tombstone guard missing. The relay's readiness probe calls it: a relay
// that could let writes through a fence must not take traffic.
func CheckReady(ctx context.Context, conn db.DBTX) error {
	problems, err := catalogProblems(ctx, conn)
	if err != nil {
		return fmt.Errorf("community deletion catalog check: %w", err)
	}
	if len(problems) == 0 {
		return nil
	}
	parts := make([]string, 0, len(problems))
	for _, p := range problems {
		parts = append(parts, p.Table+": "+p.Problem)
	}
	return fmt.Errorf("%w: %s", ErrCatalogUnsafe, strings.Join(parts, "; "))
}
