package workflow_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/workflow"
)

// FuzzParse: any text is either refused with a definition error, or
// accepted and then its canonical JSON parses back to the same definition
// (so what the relay stores is what it validated). The seed corpus is in
// testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	f.Add(validYAML)
	f.Add("name: x\ntrigger: {on: schedule, cron: '*/5 * * * *'}\nsteps: [{id: a, action: delay, duration: 1s}]")
	f.Add("name: x\ntrigger: {on: webhook}\nsteps: [{id: a, action: call_webhook, url: 'https://h.example', headers: {A: b}}]")
	f.Fuzz(func(t *testing.T, text string) {
		def, err := workflow.Parse(text)
		if err != nil {
			require.True(t, errors.Is(err, workflow.ErrInvalid), "unexpected error kind: %v", err)
			return
		}
		js, err := def.CanonicalJSON()
		require.NoError(t, err)
		again, err := workflow.Parse(string(js))
		require.NoError(t, err, "canonical JSON %s", js)
		require.Equal(t, def, again)
	})
}
