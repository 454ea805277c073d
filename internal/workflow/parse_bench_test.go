package workflow_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/buzzrelay/buzz/internal/workflow"
)

// definitionOf is a message-triggered definition of n send_message steps,
// each with an if expression of about ifBytes bytes.
func definitionOf(n, ifBytes int) string {
	var b strings.Builder
	b.WriteString("name: bench\ntrigger: {on: message_posted, filter: 'str_contains(trigger_text, \"deploy\")'}\nsteps:\n")
	for i := range n {
		cond := `str_contains(trigger_text, "x")`
		for len(cond) < ifBytes {
			cond += ` || str_contains(trigger_text, "y")`
		}
		fmt.Fprintf(&b, "  - id: s%d\n    action: send_message\n    if: '%s'\n    text: 'step %d for {{trigger.author}}'\n", i, cond, i)
	}
	return b.String()
}

// BenchmarkParseDefinition is what a step pays to read its pinned
// definition (loadPinned parses the signed YAML every step).
func BenchmarkParseDefinition(b *testing.B) {
	for _, c := range []struct{ steps, ifBytes int }{{3, 40}, {10, 200}, {50, 200}, {50, 1000}} {
		text := definitionOf(c.steps, c.ifBytes)
		b.Run(fmt.Sprintf("steps=%d,if=%dB,yaml=%dB", c.steps, c.ifBytes, len(text)), func(b *testing.B) {
			for b.Loop() {
				if _, err := workflow.Parse(text); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
