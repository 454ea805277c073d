package workflow_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/workflow"
	"github.com/buzzrelay/buzz/internal/workflow/template"
)

// A kept program serves concurrent evaluations, each with its own budget
// and answer: 24 at once each build 50 KB of text, which one shared budget
// (1 MiB) could not hold. Run under the race detector.
func TestKeptConditionsEvaluateConcurrently(t *testing.T) {
	t.Parallel()
	const expr = `str_len(trigger_text + trigger_text) > 0 && trigger_text startsWith "y"`
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Go(func() {
			first := "n"
			if i%2 == 0 {
				first = "y"
			}
			text := first + strings.Repeat("a", 25_000)
			ok, err := workflow.EvalCondition(context.Background(), expr, template.Context{Trigger: map[string]string{"text": text}})
			require.NoError(t, err)
			require.Equal(t, first == "y", ok)
		})
	}
	wg.Wait()
}
