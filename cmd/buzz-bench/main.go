// Command buzz-bench is a load generator for a Nostr relay that requires
// NIP-42 AUTH, such as Buzz. It runs timed scenarios against -url and prints
// a JSON report on stdout (progress goes to stderr):
//
//	publish  closed-loop publishers, each with its own key; accepted events/s
//	         and OK latency, plus optional live subscribers' delivery latency
//	req      sequential REQs for 100 kind-1 events over a seeded store
//	shapes   sequential REQs of each filter shape (kinds, author, id, #t,
//	         since window, NIP-50 search) over a seeded or loaded store
//	after-burst  a burst of publishes into a fresh store, then the kinds
//	         shape timed in short windows
//	fanout   many subscribers on one tag, one paced publisher; delivery latency
//	listener mention -> operator listener through the relay, OK to POST
//	         received (needs -listener-dir; see listener.go)
//
// Errors are counted in the report; the exit status is 1 only when a
// scenario could not run at all.
//
// `buzz-bench listener-setup DIR` writes the listener scenario's key and
// certificate and prints its pubkey, for the relay's configuration.
//
// `buzz-bench table REPORT.json` prints a report as a table of measures,
// targets and pass/miss (see table.go).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// options are the command-line flags.
type options struct {
	url               string
	scenario          string
	duration          time.Duration
	publishers        int   // the level being run
	publisherLevels   []int // -publishers
	relayPID          int
	metricsURL        string
	subscribers       int
	fanoutSubscribers int
	fanoutEvents      int
	reqSeed           int
	reqIterations     int
	contentBytes      int
	shapes            string
	shapesAuthor      string
	shapesTag         string
	shapesID          string
	searchCommon      string
	searchRare        string
	sinceWindow       time.Duration
	shapeBudget       time.Duration
	afterBurstEvents  int
	afterBurstFor     time.Duration
	afterBurstWindow  time.Duration
	afterBurstPace    time.Duration
	presignRate       int
	listenerDir       string
	listenerAddr      string
	listenerMentions  int
	listenerSpacing   time.Duration
	listenerIdle      time.Duration
	runID             string // marks this run's events; not a flag
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("buzz-bench", flag.ContinueOnError)
	fs.StringVar(&o.url, "url", "ws://localhost:3000", "relay URL; also the relay tag of AUTH events")
	fs.StringVar(&o.scenario, "scenario", "all", "publish, req, shapes, after-burst, fanout, listener or all (all but req, and listener only with -listener-dir)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "length of the timed publish scenario")
	levels := fs.String("publishers", "16", "publish: concurrent publisher connections; a comma-separated list runs the scenario once per count")
	fs.IntVar(&o.relayPID, "relay-pid", 0, "fanout: process id of the relay, on this machine, whose resident memory per subscriber is reported")
	fs.StringVar(&o.metricsURL, "metrics-url", "", "publish: the relay's Prometheus endpoint (http://host:port/metrics); when set, how many events the relay committed per group in each timed run is reported")
	fs.IntVar(&o.subscribers, "subscribers", 0, "publish: live subscribers measuring delivery latency")
	fs.IntVar(&o.fanoutSubscribers, "fanout-subscribers", 1000, "fanout: subscriber connections")
	fs.IntVar(&o.fanoutEvents, "fanout-events", 200, "fanout: events published, 20 ms apart")
	fs.IntVar(&o.reqSeed, "req-seed", 25000, "req: stored kind-1 events to ensure before timing")
	fs.IntVar(&o.reqIterations, "req-iterations", 500, "req: sequential REQs timed")
	fs.IntVar(&o.contentBytes, "content-bytes", 200, "bytes of content per event")
	fs.StringVar(&o.shapes, "shapes", "", "shapes: comma-separated names of the shapes to time (default: all of "+strings.Join(shapeNames, ",")+")")
	fs.StringVar(&o.shapesAuthor, "shapes-author", "", "shapes: hex pubkey of the author shape (default: the most frequent among the newest kind-1 events)")
	fs.StringVar(&o.shapesTag, "shapes-tag", "", "shapes: t value of the #t shape (default: the most frequent among the newest kind-1 events)")
	fs.StringVar(&o.shapesID, "shapes-id", "", "shapes: event id of the id shape (default: one of the newest kind-1 events)")
	fs.StringVar(&o.searchCommon, "search-common", "lorem", "shapes: a NIP-50 search term most events contain (every bench event does)")
	fs.StringVar(&o.searchRare, "search-rare", rareWord, "shapes: a NIP-50 search term few events contain (one bench event in a thousand)")
	fs.DurationVar(&o.sinceWindow, "since-window", 10*time.Minute, "shapes: the since shape asks for events this much older than the newest stored one, or newer")
	fs.DurationVar(&o.shapeBudget, "shape-budget", 5*time.Second, "shapes: stop a shape after this long even before -req-iterations (it gets at least 20 REQs)")
	fs.IntVar(&o.afterBurstEvents, "after-burst-events", 25000, "after-burst: events published in the burst")
	fs.DurationVar(&o.afterBurstFor, "after-burst-for", 90*time.Second, "after-burst: how long the kinds shape is timed after the burst")
	fs.DurationVar(&o.afterBurstWindow, "after-burst-window", 5*time.Second, "after-burst: length of each reported window")
	fs.DurationVar(&o.afterBurstPace, "after-burst-pace", 10*time.Millisecond, "after-burst: at most one REQ started per this interval")
	fs.IntVar(&o.presignRate, "presign-rate", 12000, "publish: events/s to sign before the clock starts (above any rate a relay reached on a 2-core box, so nothing is signed while the clock runs); more are signed in the background if needed, and the table says how many")
	fs.StringVar(&o.listenerDir, "listener-dir", "", "listener: the directory `buzz-bench listener-setup` wrote (the listener's key and certificate)")
	fs.StringVar(&o.listenerAddr, "listener-addr", "127.0.0.1:3302", "listener: the address the relay's BUZZ_OPERATOR_LISTENERS route names (https://ADDR/hook)")
	fs.IntVar(&o.listenerMentions, "listener-mentions", 20, "listener: spaced mentions before the idle one")
	fs.DurationVar(&o.listenerSpacing, "listener-spacing", 2500*time.Millisecond, "listener: least time between spaced mentions (up to 60% more, at random)")
	fs.DurationVar(&o.listenerIdle, "listener-idle", 2*time.Minute, "listener: silence before the last mention")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if o.publisherLevels, err = parseLevels(*levels); err != nil {
		return o, fmt.Errorf("-publishers: %w", err)
	}
	o.publishers = o.publisherLevels[0]
	return o, o.validate()
}

// parseLevels reads a comma-separated list of positive counts.
func parseLevels(s string) ([]int, error) {
	var levels []int
	for field := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(field))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive count", field)
		}
		levels = append(levels, n)
	}
	return levels, nil
}

func (o options) validate() error {
	u, err := url.Parse(o.url)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		return fmt.Errorf("-url %q: want ws://host[:port] or wss://host[:port]", o.url)
	}
	switch o.scenario {
	case "publish", "req", "shapes", "after-burst", "fanout", "listener", "all":
	default:
		return fmt.Errorf("-scenario %q: want publish, req, shapes, after-burst, fanout, listener or all", o.scenario)
	}
	if o.scenario == "listener" && o.listenerDir == "" {
		return errors.New("-scenario listener needs -listener-dir (written by `buzz-bench listener-setup DIR`)")
	}
	if o.listenerMentions <= 0 || o.listenerSpacing < 0 || o.listenerIdle < 0 {
		return errors.New("-listener-mentions must be positive, -listener-spacing and -listener-idle not negative")
	}
	for _, name := range o.shapeList() {
		if !slices.Contains(shapeNames, name) {
			return fmt.Errorf("-shapes: unknown shape %q, want some of %s", name, strings.Join(shapeNames, ","))
		}
	}
	if o.shapeBudget <= 0 || o.afterBurstEvents <= 0 || o.afterBurstFor <= 0 || o.afterBurstWindow <= 0 || o.afterBurstPace <= 0 || o.sinceWindow <= 0 {
		return errors.New("-shape-budget, -since-window and -after-burst-* must be positive")
	}
	if o.duration <= 0 || o.publishers <= 0 || o.fanoutSubscribers <= 0 || o.fanoutEvents <= 0 ||
		o.reqIterations <= 0 || o.presignRate <= 0 {
		return errors.New("-duration, -publishers, -fanout-*, -req-iterations and -presign-rate must be positive")
	}
	if o.subscribers < 0 || o.reqSeed < 0 || o.contentBytes < 0 || o.relayPID < 0 {
		return errors.New("-subscribers, -req-seed, -content-bytes and -relay-pid must not be negative")
	}
	return nil
}

// shapeList returns the shapes -shapes selects, nil for all.
func (o options) shapeList() []string {
	if o.shapes == "" {
		return nil
	}
	return strings.Split(o.shapes, ",")
}

// runs reports whether scenario name is selected: all runs every scenario
// but req, which the kinds shape repeats, and listener only when the relay
// was set up for it (-listener-dir).
func (o options) runs(name string) bool {
	switch {
	case o.scenario == name:
		return true
	case o.scenario != "all" || name == "req":
		return false
	case name == "listener":
		return o.listenerDir != ""
	}
	return true
}

// report is the JSON document printed on stdout.
type report struct {
	// Error says why nothing ran: the relay could not be reached or
	// refused the bench's AUTH.
	Error      string    `json:"error,omitempty"`
	URL        string    `json:"url"`
	RunID      string    `json:"run_id"`
	StartedAt  time.Time `json:"started_at"`
	GoMaxProcs int       `json:"go_maxprocs"`
	Scenarios  struct {
		Publish    []*publishReport  `json:"publish,omitempty"` // one per -publishers count
		AfterBurst *afterBurstReport `json:"after_burst,omitempty"`
		Shapes     *shapesReport     `json:"shapes,omitempty"`
		Req        *reqReport        `json:"req,omitempty"`
		Fanout     *fanoutReport     `json:"fanout,omitempty"`
		Listener   *listenerReport   `json:"listener,omitempty"`
	} `json:"scenarios"`
}

// failed reports whether some scenario could not run at all.
func (r *report) failed() bool {
	if r.Error != "" {
		return true
	}
	s := r.Scenarios
	for _, p := range s.Publish {
		if p.Error != "" {
			return true
		}
	}
	return (s.Req != nil && s.Req.Error != "") ||
		(s.AfterBurst != nil && s.AfterBurst.Error != "") ||
		(s.Shapes != nil && s.Shapes.Error != "") ||
		(s.Fanout != nil && s.Fanout.Error != "") ||
		(s.Listener != nil && s.Listener.Error != "")
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "listener-setup" {
		if err := runListenerSetup(os.Args[2:], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "buzz-bench listener-setup:", err)
			os.Exit(2)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "table" {
		if err := runTable(os.Args[2:], os.Stdout, os.Stderr); err != nil && !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "buzz-bench table:", err)
			os.Exit(2)
		}
		return
	}
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "buzz-bench:", err)
		os.Exit(2)
	}
	o.runID = newRunID()
	// Ctrl-C stops the scenarios early; the report of what ran is still printed.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	rep := run(ctx, o)
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		fmt.Fprintln(os.Stderr, "buzz-bench:", err)
		os.Exit(1)
	}
	switch {
	case ctx.Err() != nil:
		os.Exit(130) // interrupted: the report is partial
	case rep.failed():
		os.Exit(1)
	}
}

// run executes the selected scenarios in order: the burst first, as it
// needs a fresh store, and its events seed the shapes; then publish, whose
// events usually cover the req scenario's seed.
func run(ctx context.Context, o options) *report {
	rep := &report{URL: o.url, RunID: o.runID, StartedAt: time.Now().UTC(), GoMaxProcs: runtime.GOMAXPROCS(0)}
	// One authenticated connection first: a wrong URL or a relay that is
	// down would otherwise show only after seconds of signing a supply.
	if err := checkReachable(ctx, o.url); err != nil {
		rep.Error = fmt.Sprintf("%s: %v", o.url, err)
		logf("%s", rep.Error)
		return rep
	}
	// The listener is up from the start, so the relay's keep-alive has a
	// warm connection to it by the time its scenario runs, last.
	var listener *benchListener
	if o.runs("listener") {
		var err error
		if listener, err = startBenchListener(o.listenerDir, o.listenerAddr); err != nil {
			rep.Scenarios.Listener = &listenerReport{Error: err.Error()}
			logf("listener: %v", err)
		} else {
			defer listener.close()
		}
	}
	if o.runs("after-burst") && ctx.Err() == nil {
		rep.Scenarios.AfterBurst = runAfterBurst(ctx, o)
	}
	if o.runs("shapes") && ctx.Err() == nil {
		rep.Scenarios.Shapes = runShapes(ctx, o)
	}
	if o.runs("publish") {
		for _, n := range o.publisherLevels {
			if ctx.Err() != nil {
				break
			}
			level := o
			level.publishers = n
			rep.Scenarios.Publish = append(rep.Scenarios.Publish, runPublish(ctx, level))
		}
	}
	if o.runs("req") && ctx.Err() == nil {
		rep.Scenarios.Req = runReq(ctx, o)
	}
	if o.runs("fanout") && ctx.Err() == nil {
		rep.Scenarios.Fanout = runFanout(ctx, o)
	}
	if listener != nil && ctx.Err() == nil {
		rep.Scenarios.Listener = runListener(ctx, o, listener)
	}
	return rep
}

// checkReachable opens and closes one authenticated connection to url.
func checkReachable(ctx context.Context, url string) error {
	s, err := newSigner()
	if err != nil {
		return err
	}
	c, err := dialAuthed(ctx, url, s)
	if err != nil {
		return err
	}
	c.close()
	return nil
}

// newRunID returns 8 random hex characters.
func newRunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "buzz-bench: "+format+"\n", args...)
}
