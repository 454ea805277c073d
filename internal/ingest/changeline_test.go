package ingest

import (
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/nostr"
)

func changeInChannel(tenant community.Tenant, h string) *groupJob {
	return &groupJob{w: &Write{Tenant: tenant, Event: &nostr.Event{Tags: nostr.Tags{{"h", h}}}}}
}

func turnGiven(j *groupJob) bool {
	select {
	case <-j.turn:
		return true
	default:
		return false
	}
}

// Every spelling of a channel's id is one line: a change's handler locks the
// row of the id it parses, so a line per spelling let one key hold a
// connection per spelling waiting for the same row. Changes take their
// turns in the order they joined; one leaving from the middle passes no
// turn, the one with the turn passes it to the next, and an empty line is
// forgotten. Mutations killed: the line keyed by the h tag's text (four
// lines); leave passing the turn whatever the place (the middle change
// gives the third its turn); an empty line kept.
func TestChangeLinesOfAChannel(t *testing.T) {
	tenant := community.FromRow(db.Community{ID: uuid.New(), Host: "lines.example"})
	channel := uuid.New()
	var lines changeLines
	spellings := []string{
		channel.String(),
		strings.ToUpper(channel.String()),
		"{" + channel.String() + "}",
		"urn:uuid:" + channel.String(),
	}
	var jobs []*groupJob
	for _, h := range spellings {
		j := changeInChannel(tenant, h)
		require.True(t, lines.join(j, false), h)
		jobs = append(jobs, j)
	}
	require.Len(t, lines.lines, 1, "lines for one channel")
	require.True(t, turnGiven(jobs[0]))
	for _, j := range jobs[1:] {
		require.False(t, turnGiven(j))
	}

	lines.leave(jobs[1]) // from the middle: nobody's turn yet
	require.False(t, turnGiven(jobs[2]))
	lines.leave(jobs[0])
	require.True(t, turnGiven(jobs[2]), "the turn passes to the next in line")
	require.False(t, turnGiven(jobs[3]))
	lines.leave(jobs[2])
	require.True(t, turnGiven(jobs[3]))
	lines.leave(jobs[3])
	require.Empty(t, lines.lines, "an empty line is forgotten")

	// An event naming no channel, or no channel id, joins no line.
	require.False(t, lines.join(&groupJob{w: &Write{Tenant: tenant, Event: &nostr.Event{}}}, false))
	require.False(t, lines.join(changeInChannel(tenant, "not-a-uuid"), false))
	// busyOnly: only behind changes already in line.
	require.False(t, lines.join(changeInChannel(tenant, channel.String()), true))
	first := changeInChannel(tenant, channel.String())
	require.True(t, lines.join(first, false))
	require.True(t, lines.join(changeInChannel(tenant, strings.ToUpper(channel.String())), true))
}
