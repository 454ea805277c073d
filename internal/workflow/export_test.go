package workflow

import (
	"github.com/google/uuid"
)

// SetBeforeCommit installs a hook that runs inside every step transaction
// just before it commits (tests: stall or observe a worker mid-step).
func (e *Engine) SetBeforeCommit(fn func(run uuid.UUID, step int)) { e.beforeCommit = fn }

// DefinitionsReadBack is how many times the engine's steps read a pinned
// definition parsed before instead of parsing it.
func (e *Engine) DefinitionsReadBack() int { return e.definitions.readBack() }

// SavesReadBack is how many saves' Prepare read the definition their
// Validate parsed instead of parsing it.
func (t *Triggers) SavesReadBack() int { return t.savedDefinitions.readBack() }

func (c *definitionCache) readBack() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits
}

// SchedulesDecoded is how many times the scheduler decoded a workflow's
// schedule from its stored definition.
func (s *Scheduler) SchedulesDecoded() int { return s.decoded }

// Mentionable is mentionable: the members a send_message step reads to
// resolve its template's mentions.
var Mentionable = mentionable
