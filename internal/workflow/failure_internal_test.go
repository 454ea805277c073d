package workflow

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// A recorded diagnostic keeps the failure before it and stays bounded: at
// most MaxErrorMessageBytes, cut on a character boundary and marked.
// Mutation killed: boundedMessage returning msg whole keeps 10,000 bytes.
func TestRecordedFailureIsBounded(t *testing.T) {
	t.Parallel()
	f := fail(CodeStepTimeout, "step s did not finish within its timeout of 1s").after("step s: " + strings.Repeat("é", 5000))
	require.True(t, strings.HasPrefix(f.message, "step s did not finish within its timeout of 1s; before that: step s: é"))
	msg := boundedMessage(f.message)
	require.LessOrEqual(t, len(msg), MaxErrorMessageBytes)
	require.True(t, utf8.ValidString(msg))
	require.True(t, strings.HasSuffix(msg, "é…"))
	require.Equal(t, "short", boundedMessage("short"))
}
