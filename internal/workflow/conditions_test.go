package workflow_test

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/workflow"
	"github.com/buzzrelay/buzz/internal/workflow/template"
)

// A kept program serves concurrent evaluations, each with its own answer.
// Run under the race detector, which reports any state an evaluation
// writes in the shared program.
func TestKeptConditionsEvaluateConcurrently(t *testing.T) {
	t.Parallel()
	const expr = `str_len(trigger_text + trigger_text) > 2 && trigger_text startsWith "y"`
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 20 {
				first := "n"
				if (i+j)%2 == 0 {
					first = "y"
				}
				text := first + strconv.Itoa(i*100+j)
				ok, err := workflow.EvalCondition(context.Background(), expr, template.Context{Trigger: map[string]string{"text": text}})
				require.NoError(t, err)
				require.Equal(t, first == "y", ok, text)
			}
		})
	}
	wg.Wait()
}
