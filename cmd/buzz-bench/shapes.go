package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
)

// minShapeSamples is how many REQs a shape gets even when they are slower
// than -shape-budget allows.
const minShapeSamples = 20

// shapeResult is the timing of one REQ shape.
type shapeResult struct {
	Name      string         `json:"name"`
	Filter    map[string]any `json:"filter,omitempty"`
	Completed int            `json:"completed"`
	EventsMin int            `json:"events_min"` // events per REQ, fewest and most
	EventsMax int            `json:"events_max"`
	Latency   latencyStats   `json:"latency"` // REQ sent to EOSE received
	Errors    tallyReport    `json:"errors"`
	Skipped   string         `json:"skipped,omitempty"`
}

// shapesReport is the result of the shapes scenario.
type shapesReport struct {
	SeedTarget   int           `json:"seed_target"`
	Existing     int64         `json:"existing_before"` // -1 when COUNT failed
	ToppedUp     int           `json:"topped_up"`
	TopUpSeconds float64       `json:"top_up_s"`
	Sample       sampleSummary `json:"sample"` // what the discovery REQ found
	Shapes       []shapeResult `json:"shapes"`
	Errors       tallyReport   `json:"errors"`
	Error        string        `json:"error,omitempty"`
}

// sampleSummary is what the shapes are built from: flags win, else the
// newest stored kind-1 events tell.
type sampleSummary struct {
	Events int    `json:"events"`
	Author string `json:"author,omitempty"` // the most frequent pubkey
	Tag    string `json:"tag,omitempty"`    // the most frequent t value
	ID     string `json:"id,omitempty"`
	Newest int64  `json:"newest_created_at,omitempty"`
}

// sampledEvent is the part of a stored event the discovery reads.
type sampledEvent struct {
	ID        string     `json:"id"`
	PubKey    string     `json:"pubkey"`
	CreatedAt int64      `json:"created_at"`
	Tags      [][]string `json:"tags"`
}

// summarizeSample picks the author and t tag that occur most often among
// events (ties go to the smaller value, so the choice is reproducible), the
// id of the middle event and the newest created_at.
func summarizeSample(events []sampledEvent) sampleSummary {
	s := sampleSummary{Events: len(events)}
	if len(events) == 0 {
		return s
	}
	authors, tags := map[string]int{}, map[string]int{}
	for _, ev := range events {
		authors[ev.PubKey]++
		for _, tag := range ev.Tags {
			if len(tag) >= 2 && tag[0] == "t" {
				tags[tag[1]]++
			}
		}
		s.Newest = max(s.Newest, ev.CreatedAt)
	}
	s.Author, s.Tag = mostFrequent(authors), mostFrequent(tags)
	s.ID = events[len(events)/2].ID
	return s
}

func mostFrequent(counts map[string]int) string {
	keys := slices.SortedFunc(maps.Keys(counts), func(a, b string) int {
		return cmp.Or(cmp.Compare(counts[b], counts[a]), cmp.Compare(a, b))
	})
	if len(keys) == 0 {
		return ""
	}
	return keys[0]
}

// shapeNames are the shapes in the order they run.
var shapeNames = []string{"kinds", "author", "id", "tag", "since", "search-common", "search-rare"}

// reqShape is one named filter.
type reqShape struct {
	name    string
	filter  map[string]any
	skipped string
}

// buildShapes turns the sample (overridden by flags) into the timed shapes.
func buildShapes(o options, s sampleSummary) []reqShape {
	author, tag, id := cmp.Or(o.shapesAuthor, s.Author), cmp.Or(o.shapesTag, s.Tag), cmp.Or(o.shapesID, s.ID)
	newest := s.Newest
	if newest == 0 {
		newest = time.Now().Unix()
	}
	shapes := []reqShape{
		{name: "kinds", filter: map[string]any{"kinds": []int{1}, "limit": reqLimit}},
		{name: "author", filter: map[string]any{"authors": []string{author}, "kinds": []int{1}, "limit": reqLimit}},
		{name: "id", filter: map[string]any{"ids": []string{id}}},
		{name: "tag", filter: map[string]any{"#t": []string{tag}, "limit": reqLimit}},
		// The window ends at the newest stored event, so a store loaded
		// earlier still has events in it.
		{name: "since", filter: map[string]any{"since": newest - int64(o.sinceWindow/time.Second), "limit": reqLimit}},
		{name: "search-common", filter: map[string]any{"search": o.searchCommon, "limit": searchLimit}},
		{name: "search-rare", filter: map[string]any{"search": o.searchRare, "limit": searchLimit}},
	}
	for i := range shapes {
		switch {
		case shapes[i].name == "author" && author == "",
			shapes[i].name == "id" && id == "":
			shapes[i].skipped = "no stored kind-1 event to take it from"
		case shapes[i].name == "tag" && tag == "":
			shapes[i].skipped = "no t tag among the newest kind-1 events; pass -shapes-tag"
		}
	}
	return shapes
}

// searchLimit is the page size of the timed NIP-50 searches.
const searchLimit = 10

func runShapes(ctx context.Context, o options) *shapesReport {
	rep := &shapesReport{SeedTarget: o.reqSeed, Existing: -1}
	var errs tally
	defer func() { rep.Errors = errs.report() }()
	seed := &reqReport{Existing: -1}
	if err := ensureSeed(ctx, o, seed, &errs); err != nil {
		rep.Error = err.Error()
		return rep
	}
	rep.Existing, rep.ToppedUp, rep.TopUpSeconds = seed.Existing, seed.ToppedUp, seed.TopUpSeconds

	s, err := newSigner()
	if err != nil {
		rep.Error = err.Error()
		return rep
	}
	conn, err := dialAuthed(ctx, o.url, s)
	if err != nil {
		rep.Error = err.Error()
		return rep
	}
	defer func() { conn.close() }()
	sample, err := conn.sample(ctx, map[string]any{"kinds": []int{1}, "limit": reqLimit})
	if err != nil {
		rep.Error = "discovery REQ: " + err.Error()
		return rep
	}
	rep.Sample = summarizeSample(sample)
	selected := o.shapeList()
	for _, shape := range buildShapes(o, rep.Sample) {
		if ctx.Err() != nil {
			break
		}
		if selected != nil && !slices.Contains(selected, shape.name) {
			continue
		}
		res := shapeResult{Name: shape.name, Filter: shape.filter, Skipped: shape.skipped}
		if shape.skipped == "" {
			logf("shapes: %s %s", shape.name, clientFrame("REQ", "s", shape.filter))
			conn = timeShape(ctx, o, conn, shape, &res)
		}
		rep.Shapes = append(rep.Shapes, res)
		if conn == nil {
			rep.Error = "the REQ connection failed"
			break
		}
	}
	return rep
}

// timeShape runs one shape's REQs back to back on conn until -req-iterations
// or -shape-budget (but at least minShapeSamples) and fills res. It returns
// the connection to use next, nil if it broke and could not be replaced.
func timeShape(ctx context.Context, o options, conn *relayConn, shape reqShape, res *shapeResult) *relayConn {
	var errs tally
	defer func() { res.Errors = errs.report() }()
	latencies := make([]time.Duration, 0, o.reqIterations)
	res.EventsMin = -1
	start := time.Now()
	for i := 0; i < o.reqIterations && ctx.Err() == nil; i++ {
		if len(latencies) >= minShapeSamples && time.Since(start) > o.shapeBudget {
			break
		}
		d, events, err := timedReq(ctx, conn, fmt.Sprintf("%s-%d", shape.name, i), shape.filter)
		if err != nil {
			errs.addErr("REQ", err)
			if errors.Is(err, errClosed) {
				continue
			}
			conn.close()
			if conn = redial(ctx, o, &errs); conn == nil {
				break
			}
			continue
		}
		latencies = append(latencies, d)
		if res.EventsMin < 0 || events < res.EventsMin {
			res.EventsMin = events
		}
		res.EventsMax = max(res.EventsMax, events)
	}
	res.EventsMin = max(res.EventsMin, 0)
	res.Completed = len(latencies)
	res.Latency = summarize(latencies)
	return conn
}

// redial replaces a broken REQ connection, or returns nil.
func redial(ctx context.Context, o options, errs *tally) *relayConn {
	s, err := newSigner()
	if err != nil {
		errs.addErr("connect", err)
		return nil
	}
	conn, err := dialAuthed(ctx, o.url, s)
	if err != nil {
		errs.addErr("connect", err)
		return nil
	}
	return conn
}

// sample runs one REQ and decodes its stored events, then closes it.
func (c *relayConn) sample(ctx context.Context, filter any) ([]sampledEvent, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	const subID = "bench-sample"
	if err := c.send(ctx, clientFrame("REQ", subID, filter)); err != nil {
		return nil, err
	}
	var events []sampledEvent
	for {
		msg, err := c.next(ctx)
		if err != nil {
			return events, err
		}
		if string(msg.SubID) != subID {
			continue
		}
		switch msg.Verb {
		case verbEvent:
			var ev sampledEvent
			if err := json.Unmarshal(msg.Event, &ev); err != nil {
				return events, fmt.Errorf("stored event: %w", err)
			}
			events = append(events, ev)
		case verbEOSE:
			return events, c.send(ctx, clientFrame("CLOSE", subID))
		case verbClosed:
			return events, fmt.Errorf("%w: %s", errClosed, msg.Text)
		}
	}
}
