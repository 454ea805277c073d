package condition

import (
	"testing"

	"github.com/expr-lang/expr"
	"github.com/stretchr/testify/require"
)

// compileWithBlockingHelper compiles an expression calling a helper that
// blocks until release is closed, standing in for work that would never
// end.
func compileWithBlockingHelper(t *testing.T, release chan struct{}) *Program {
	t.Helper()
	saved := extraFunctions
	extraFunctions = []expr.Option{expr.Function("block_until_released", func(...any) (any, error) {
		<-release
		return true, nil
	}, new(func() bool))}
	defer func() { extraFunctions = saved }()
	p, err := Compile(`block_until_released()`)
	require.NoError(t, err)
	return p
}
