package condition

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/expr-lang/expr"
	"github.com/stretchr/testify/require"
)

// scanningExpression tests n times that 0 is not among the 9,998 elements
// of a range: each test scans the whole range.
func scanningExpression(n int) string {
	return "let r = 1..9998; " + strings.Repeat("!(0 in r) && ", n) + "true"
}

// A machine too busy to run the evaluation for a while must not make it
// fail: its work is bounded by its limits, and the answer is the same
// however long it waited for a CPU. Here one CPU (GOMAXPROCS 1) is shared
// with busy goroutines, so the evaluation, which needs two of the
// scheduler's 10 ms slices (the most scanning one evaluation may do; six to
// twelve under the race detector), gets one slice in every 9. (With 16 busy
// goroutines, one in 17, it ran past the 10 s backstop under the race
// detector on a box loaded five times over.)
// It failed under the 100 ms wall-clock deadline Eval had, as a trivial
// condition did under `make test` beside other jobs.
// Mutation killed: Eval waiting at most 100 ms.
func TestAStarvedEvaluationGivesItsAnswer(t *testing.T) {
	// Not parallel: it changes GOMAXPROCS for the whole process.
	p, err := Compile(scanningExpression(26))
	require.NoError(t, err)

	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var stop atomic.Bool
	var busy sync.WaitGroup
	for range 8 {
		busy.Go(func() {
			for !stop.Load() {
			}
		})
	}
	ok, err := p.Eval(context.Background(), testVars())
	stop.Store(true)
	busy.Wait()
	require.NoError(t, err)
	require.True(t, ok)
}

// The same with the evaluation held up deterministically: its helper waits
// for a lock the test holds for 300 ms (a machine that did not run it for
// that long), then answers.
// Mutation killed: Eval waiting at most 100 ms.
func TestAnEvaluationHeldUpGivesItsAnswer(t *testing.T) {
	// Not parallel with the other tests of this file: it swaps the extra
	// helpers, which Compile reads.
	var held sync.Mutex
	held.Lock()
	saved := extraFunctions
	extraFunctions = []expr.Option{expr.Function("wait_for_the_lock", func(...any) (any, error) {
		held.Lock()
		defer held.Unlock()
		return true, nil
	}, new(func() bool))}
	p, err := Compile(`wait_for_the_lock() && trigger_text != ""`)
	extraFunctions = saved
	require.NoError(t, err)

	time.AfterFunc(300*time.Millisecond, held.Unlock)
	ok, err := p.Eval(context.Background(), testVars())
	require.NoError(t, err)
	require.True(t, ok)
}

// shortBackstop makes Eval give up after d for the rest of the test.
func shortBackstop(t *testing.T, d time.Duration) {
	saved := backstop
	backstop = d
	t.Cleanup(func() { backstop = saved })
}

// An evaluation that would never end (a helper that blocks) is given up on
// at the backstop, and when its context is cancelled.
// Mutation killed: Eval without a backstop (the test times out).
func TestEvalStopsAtTheBackstop(t *testing.T) {
	// Not parallel with the other tests of this file: it swaps the extra
	// helpers, which Compile reads, and shortens the backstop.
	release := make(chan struct{})
	defer close(release)
	p := compileWithBlockingHelper(t, release)
	shortBackstop(t, 50*time.Millisecond)

	result := make(chan error, 1)
	go func() {
		_, err := p.Eval(context.Background(), testVars())
		result <- err
	}()
	var err error
	select {
	case err = <-result:
	case <-time.After(time.Minute):
		t.Fatal("Eval still waits for a blocked evaluation a minute after its backstop")
	}
	var cerr *Error
	require.ErrorAs(t, err, &cerr)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, cerr.Reason, "backstop")

	// Evaluations sharing one event's limits share one backstop: once it
	// passed, the next is not started. Mutation killed: each shared
	// evaluation waited for a backstop of its own.
	shared := WithShare(context.Background(), 2)
	_, err = p.Eval(shared, testVars())
	require.ErrorContains(t, err, "backstop")
	_, err = p.Eval(shared, testVars())
	require.ErrorAs(t, err, &cerr)
	require.Equal(t, "evaluation not started", cerr.Reason)

	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = p.Eval(canceled, testVars())
	require.ErrorIs(t, err, context.Canceled)
}
