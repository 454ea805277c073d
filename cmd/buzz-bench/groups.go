package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// groupReport is how the relay grouped the timed publish run's events into
// transactions (group commit), from its Prometheus endpoint (-metrics-url).
type groupReport struct {
	Groups         int     `json:"groups,omitempty"`
	EventsPerGroup float64 `json:"events_per_group,omitempty"`
	Failed         int     `json:"failed_groups,omitempty"`
	Error          string  `json:"error,omitempty"` // the scrape failed: no counts
}

// groupCounters are the relay's group-commit counters at one moment.
type groupCounters struct {
	events, groups, failed float64
}

// groupSeries are the series groupCounters reads, by the field they fill.
var groupSeries = map[string]func(*groupCounters) *float64{
	"buzz_ingest_group_events_sum":    func(c *groupCounters) *float64 { return &c.events },
	"buzz_ingest_group_events_count":  func(c *groupCounters) *float64 { return &c.groups },
	"buzz_ingest_groups_failed_total": func(c *groupCounters) *float64 { return &c.failed },
}

// parseGroupCounters reads the group-commit counters from a Prometheus
// text exposition; each must be there.
func parseGroupCounters(r io.Reader) (groupCounters, error) {
	var c groupCounters
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		field := groupSeries[name]
		if !ok || field == nil {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return c, fmt.Errorf("%s: %w", name, err)
		}
		*field(&c) = v
		seen[name] = true
	}
	if err := sc.Err(); err != nil {
		return c, err
	}
	for name := range groupSeries {
		if !seen[name] {
			return c, fmt.Errorf("%s is not served (not a buzz relay's metrics, or an older relay)", name)
		}
	}
	return c, nil
}

// scrapeGroups fetches the relay's group-commit counters.
func scrapeGroups(ctx context.Context, url string) (groupCounters, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return groupCounters{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return groupCounters{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return groupCounters{}, fmt.Errorf("%s: HTTP %d", url, resp.StatusCode)
	}
	return parseGroupCounters(resp.Body)
}

// groupsBetween reports the groups written between two scrapes.
func groupsBetween(before, after groupCounters) *groupReport {
	rep := &groupReport{Groups: int(after.groups - before.groups), Failed: int(after.failed - before.failed)}
	if rep.Groups > 0 {
		rep.EventsPerGroup = (after.events - before.events) / float64(rep.Groups)
	}
	return rep
}
