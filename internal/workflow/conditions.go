package workflow

import (
	"context"
	"errors"

	"github.com/buzzrelay/buzz/internal/workflow/condition"
	"github.com/buzzrelay/buzz/internal/workflow/template"
)

// errNoConditions fails closed when no evaluator was configured.
var errNoConditions = errors.New("no condition evaluator configured")

// EvalCondition compiles and evaluates a filter or if expression within the
// condition package's size and time limits.
func EvalCondition(ctx context.Context, expr string, tc template.Context) (bool, error) {
	prog, err := condition.Compile(expr)
	if err != nil {
		return false, err
	}
	return prog.Eval(ctx, condition.VarsFrom(tc))
}
