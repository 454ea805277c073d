package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/deletion"
)

// On a terminal the display redraws one line in place with the stage, the
// chunk, the counts, the rate and the ETA. Kills: an ETA computed from the
// wrong total, a display that scrolls instead of redrawing.
func TestProgressDisplayOnATerminal(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d := &progressDisplay{out: &out, now: func() time.Time { return clock }}
	id := uuid.New()
	d.update(deletion.Progress{RequestID: id, Stage: deletion.StageDrained, Step: "delete objects", Chunk: 0, Chunks: 2, ObjectsTotal: 10001})
	clock = clock.Add(2 * time.Second)
	d.update(deletion.Progress{RequestID: id, Stage: deletion.StageDrained, Step: "delete objects", Chunk: 1, Chunks: 2, ObjectsDeleted: 10000, ObjectsTotal: 10001})
	d.finish()
	text := out.String()
	require.Equal(t, 2, strings.Count(text, "\r\033[K"), "redrawn in place")
	require.Contains(t, text, "chunk 1 of 2")
	require.Contains(t, text, "objects 10000")
	require.Contains(t, text, "5000 objects/s")
	require.Contains(t, text, "ETA 0s")
	require.True(t, strings.HasSuffix(text, "\n"))
}
