package workflow

import "github.com/google/uuid"

// SetBeforeCommit installs a hook that runs inside every step transaction
// just before it commits (tests: stall or observe a worker mid-step).
func (e *Engine) SetBeforeCommit(fn func(run uuid.UUID, step int)) { e.beforeCommit = fn }
