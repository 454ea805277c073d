package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSummarizeSamplePicksTheMostFrequent(t *testing.T) {
	t.Parallel()
	events := []sampledEvent{
		{ID: "e0", PubKey: "bob", CreatedAt: 10, Tags: [][]string{{"t", "go"}, {"p", "x"}}},
		{ID: "e1", PubKey: "alice", CreatedAt: 30, Tags: [][]string{{"t", "rust"}}},
		{ID: "e2", PubKey: "carol", CreatedAt: 20, Tags: [][]string{{"t", "rust"}, {"t"}}},
		{ID: "e3", PubKey: "alice", CreatedAt: 5},
		{ID: "e4", PubKey: "bob", CreatedAt: 1, Tags: [][]string{{"t", "go"}}},
	}
	got := summarizeSample(events)
	// alice and bob tie at two: the smaller wins, so runs agree.
	require.Equal(t, sampleSummary{Events: 5, Author: "alice", Tag: "go", ID: "e2", Newest: 30}, got)
	require.Equal(t, sampleSummary{}, summarizeSample(nil))
}

func TestBuildShapes(t *testing.T) {
	t.Parallel()
	o := options{searchCommon: "lorem", searchRare: "quokka", sinceWindow: 10 * time.Minute}
	sample := sampleSummary{Events: 100, Author: "alice", Tag: "go", ID: "e2", Newest: 10_000}
	byName := func(shapes []reqShape) map[string]reqShape {
		m := map[string]reqShape{}
		for _, s := range shapes {
			m[s.name] = s
		}
		return m
	}
	all := buildShapes(o, sample)
	for i, s := range all {
		require.Equal(t, shapeNames[i], s.name)
	}
	shapes := byName(all)
	require.Equal(t, map[string]any{"authors": []string{"alice"}, "kinds": []int{1}, "limit": 100}, shapes["author"].filter)
	require.Equal(t, map[string]any{"ids": []string{"e2"}}, shapes["id"].filter)
	require.Equal(t, map[string]any{"#t": []string{"go"}, "limit": 100}, shapes["tag"].filter)
	require.Equal(t, map[string]any{"since": int64(10_000 - 600), "limit": 100}, shapes["since"].filter)
	require.Equal(t, map[string]any{"search": "quokka", "limit": 10}, shapes["search-rare"].filter)
	for _, s := range shapes {
		require.Empty(t, s.skipped, s.name)
	}

	// Flags win over the sample.
	o.shapesAuthor, o.shapesTag, o.shapesID = "dave", "zig", "e9"
	shapes = byName(buildShapes(o, sample))
	require.Equal(t, []string{"dave"}, shapes["author"].filter["authors"])
	require.Equal(t, []string{"zig"}, shapes["tag"].filter["#t"])
	require.Equal(t, []string{"e9"}, shapes["id"].filter["ids"])

	// An empty store: the shapes without a value are skipped, with a reason.
	o.shapesAuthor, o.shapesTag, o.shapesID = "", "", ""
	shapes = byName(buildShapes(o, sampleSummary{}))
	for _, name := range []string{"author", "id", "tag"} {
		require.NotEmpty(t, shapes[name].skipped, name)
	}
	require.Empty(t, shapes["kinds"].skipped)
	since := shapes["since"].filter["since"].(int64)
	require.InDelta(t, time.Now().Unix()-600, since, 5, "without a sample the window ends now")
}

func TestWorstWindow(t *testing.T) {
	t.Parallel()
	require.Nil(t, worstWindow(nil))
	ws := []windowLatency{
		{StartSeconds: 0, Latency: latencyStats{Count: 10, P50: 2}},
		{StartSeconds: 5, Latency: latencyStats{Count: 10, P50: 26}},
		{StartSeconds: 10}, // no sample: never the worst, however it reads
		{StartSeconds: 15, Latency: latencyStats{Count: 10, P50: 3}},
	}
	require.Equal(t, 5.0, worstWindow(ws).StartSeconds)
	require.Nil(t, worstWindow(ws[2:3]))

	require.Equal(t, 0, windowOf(4999*time.Millisecond, 5*time.Second))
	require.Equal(t, 1, windowOf(5*time.Second, 5*time.Second))
	require.Equal(t, 17, windowOf(89*time.Second, 5*time.Second))
}

func TestContentCarriesSearchWords(t *testing.T) {
	t.Parallel()
	rare := 0
	const streams, perStream = 16, 250 // shorter streams than rareEvery
	for stream := range streams {
		for seq := range perStream {
			c := content("r", stream, seq, 200)
			require.Len(t, c, 200)
			require.Contains(t, c, " lorem ")
			if strings.Contains(c, rareWord) {
				require.True(t, isRare(stream, seq))
				rare++
			}
		}
	}
	// One in rareEvery, give or take the rounding of short streams.
	require.InDelta(t, streams*perStream/rareEvery, rare, 2)
}

func TestSeedEventsCarryTopics(t *testing.T) {
	t.Parallel()
	s, err := newSigner()
	require.NoError(t, err)
	spec := eventSpec{signer: s, runID: "r", contentBytes: 64, topics: 8}
	seen := map[string]bool{}
	for seq := range 16 {
		ev, err := spec.build(seq)
		require.NoError(t, err)
		require.Contains(t, string(ev.frame), `["t","topic-`)
		seen[string(ev.frame[strings.Index(string(ev.frame), `"topic-`):][:8])] = true
	}
	require.Len(t, seen, 8)
	require.Nil(t, spec.tags, "building must not write into the spec's shared tags")
}

func TestParseFlagsValidatesTheNewScenarios(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"shapes", "after-burst"} {
		o, err := parseFlags([]string{"-scenario", name})
		require.NoError(t, err)
		require.True(t, o.runs(name))
		require.False(t, o.runs("publish"))
	}
	o, err := parseFlags(nil)
	require.NoError(t, err)
	require.True(t, o.runs("shapes") && o.runs("after-burst") && o.runs("fanout"))
	require.False(t, o.runs("req"), "all leaves out req: the kinds shape repeats it")
	_, err = parseFlags([]string{"-after-burst-window", "0s"})
	require.Error(t, err)
	o, err = parseFlags([]string{"-shapes", "kinds,id"})
	require.NoError(t, err)
	require.Equal(t, []string{"kinds", "id"}, o.shapeList())
	_, err = parseFlags([]string{"-shapes", "kinds,ids"})
	require.ErrorContains(t, err, `unknown shape "ids"`)
}
