package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const exposition = `# HELP buzz_ingest_group_events Events per group committed together.
# TYPE buzz_ingest_group_events histogram
buzz_ingest_group_events_bucket{le="1"} 10
buzz_ingest_group_events_bucket{le="+Inf"} 40
buzz_ingest_group_events_sum 250
buzz_ingest_group_events_count 40
buzz_ingest_groups_failed_total 1
buzz_ingest_waiting_events 3
`

func TestParseGroupCounters(t *testing.T) {
	c, err := parseGroupCounters(strings.NewReader(exposition))
	require.NoError(t, err)
	require.Equal(t, groupCounters{events: 250, groups: 40, failed: 1}, c)

	rep := groupsBetween(groupCounters{events: 50, groups: 15}, c)
	require.Equal(t, &groupReport{Groups: 25, EventsPerGroup: 8, Failed: 1}, rep)

	_, err = parseGroupCounters(strings.NewReader("buzz_connections 1\n"))
	require.ErrorContains(t, err, "is not served")
	_, err = parseGroupCounters(strings.NewReader(strings.Replace(exposition, "_sum 250", "_sum x", 1)))
	require.ErrorContains(t, err, "buzz_ingest_group_events_sum")
}
