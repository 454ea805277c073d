package workflow_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

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

// BenchmarkScheduleTickDecode is what a scheduler tick pays per schedule
// workflow before it looks at slots: decoding the stored canonical JSON.
func BenchmarkScheduleTickDecode(b *testing.B) {
	for _, c := range []struct{ steps, ifBytes int }{{3, 40}, {50, 200}} {
		def, err := workflow.Parse(strings.Replace(definitionOf(c.steps, c.ifBytes), "trigger: {on: message_posted, filter: 'str_contains(trigger_text, \"deploy\")'}", "trigger: {on: schedule, cron: '0 * * * * *'}", 1))
		if err != nil {
			b.Fatal(err)
		}
		raw, _ := json.Marshal(def)
		b.Run(fmt.Sprintf("steps=%d,json=%dB", c.steps, len(raw)), func(b *testing.B) {
			for b.Loop() {
				var d workflow.Definition
				if err := json.Unmarshal(raw, &d); err != nil {
					b.Fatal(err)
				}
				_ = workflow.Slots(d.Trigger, time.Unix(1_900_000_000, 0), time.Unix(1_900_000_001, 0))
			}
		})
	}
}
