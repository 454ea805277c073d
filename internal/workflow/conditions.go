package workflow

import (
	"context"
	"errors"
	"sync"

	"github.com/buzzrelay/buzz/internal/workflow/condition"
	"github.com/buzzrelay/buzz/internal/workflow/template"
)

// errNoConditions fails closed when no evaluator was configured.
var errNoConditions = errors.New("no condition evaluator configured")

// EvalCondition compiles and evaluates a filter or if expression within the
// condition package's size and time limits. Compiled expressions are kept
// (compiledConditions): a channel's filters are evaluated for every message
// in its write transaction, and compiling one costs far more than running
// it.
func EvalCondition(ctx context.Context, expr string, tc template.Context) (bool, error) {
	prog, err := compiledConditions.get(expr)
	if err != nil {
		return false, err
	}
	return prog.Eval(ctx, condition.VarsFrom(tc))
}

// maxCompiledConditions bounds the kept programs: a full channel's filters
// and if expressions, times many channels. Past it the cache starts again
// empty, which only costs recompiling.
const maxCompiledConditions = 4096

var compiledConditions = &conditionCache{programs: map[string]*condition.Program{}}

// conditionCache maps an expression's text to its compiled program. A
// program is immutable and evaluated with a fresh VM and budget each time,
// so one may serve any number of evaluations at once.
type conditionCache struct {
	mu       sync.Mutex
	programs map[string]*condition.Program
}

func (c *conditionCache) get(expr string) (*condition.Program, error) {
	c.mu.Lock()
	prog, ok := c.programs[expr]
	c.mu.Unlock()
	if ok {
		return prog, nil
	}
	prog, err := condition.Compile(expr)
	if err != nil {
		return nil, err // refused when saved; not worth keeping
	}
	c.mu.Lock()
	if len(c.programs) >= maxCompiledConditions {
		clear(c.programs)
	}
	c.programs[expr] = prog
	c.mu.Unlock()
	return prog, nil
}
