// Command buzz-bench is a load generator for a Nostr relay that requires
// NIP-42 AUTH, such as Buzz. It runs timed scenarios against -url and prints
// a JSON report on stdout (progress goes to stderr):
//
//	publish  closed-loop publishers, each with its own key; accepted events/s
//	         and OK latency, plus optional live subscribers' delivery latency
//	req      sequential REQs for 100 kind-1 events over a seeded store
//	fanout   many subscribers on one tag, one paced publisher; delivery latency
//
// Errors are counted in the report; the exit status is 1 only when a
// scenario could not run at all.
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
	"syscall"
	"time"
)

// options are the command-line flags.
type options struct {
	url               string
	scenario          string
	duration          time.Duration
	publishers        int
	subscribers       int
	fanoutSubscribers int
	fanoutEvents      int
	reqSeed           int
	reqIterations     int
	contentBytes      int
	presignRate       int
	runID             string // marks this run's events; not a flag
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("buzz-bench", flag.ContinueOnError)
	fs.StringVar(&o.url, "url", "ws://localhost:3000", "relay URL; also the relay tag of AUTH events")
	fs.StringVar(&o.scenario, "scenario", "all", "publish, req, fanout or all")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "length of the timed publish scenario")
	fs.IntVar(&o.publishers, "publishers", 16, "publish: concurrent publisher connections")
	fs.IntVar(&o.subscribers, "subscribers", 0, "publish: live subscribers measuring delivery latency")
	fs.IntVar(&o.fanoutSubscribers, "fanout-subscribers", 1000, "fanout: subscriber connections")
	fs.IntVar(&o.fanoutEvents, "fanout-events", 200, "fanout: events published, 20 ms apart")
	fs.IntVar(&o.reqSeed, "req-seed", 25000, "req: stored kind-1 events to ensure before timing")
	fs.IntVar(&o.reqIterations, "req-iterations", 500, "req: sequential REQs timed")
	fs.IntVar(&o.contentBytes, "content-bytes", 200, "bytes of content per event")
	fs.IntVar(&o.presignRate, "presign-rate", 4000, "publish: events/s to sign before the clock starts; more are signed in the background if needed")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return o, o.validate()
}

func (o options) validate() error {
	u, err := url.Parse(o.url)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		return fmt.Errorf("-url %q: want ws://host[:port] or wss://host[:port]", o.url)
	}
	switch o.scenario {
	case "publish", "req", "fanout", "all":
	default:
		return fmt.Errorf("-scenario %q: want publish, req, fanout or all", o.scenario)
	}
	if o.duration <= 0 || o.publishers <= 0 || o.fanoutSubscribers <= 0 || o.fanoutEvents <= 0 ||
		o.reqIterations <= 0 || o.presignRate <= 0 {
		return errors.New("-duration, -publishers, -fanout-*, -req-iterations and -presign-rate must be positive")
	}
	if o.subscribers < 0 || o.reqSeed < 0 || o.contentBytes < 0 {
		return errors.New("-subscribers, -req-seed and -content-bytes must not be negative")
	}
	return nil
}

func (o options) runs(name string) bool { return o.scenario == "all" || o.scenario == name }

// report is the JSON document printed on stdout.
type report struct {
	URL        string    `json:"url"`
	RunID      string    `json:"run_id"`
	StartedAt  time.Time `json:"started_at"`
	GoMaxProcs int       `json:"go_maxprocs"`
	Scenarios  struct {
		Publish *publishReport `json:"publish,omitempty"`
		Req     *reqReport     `json:"req,omitempty"`
		Fanout  *fanoutReport  `json:"fanout,omitempty"`
	} `json:"scenarios"`
}

// failed reports whether some scenario could not run at all.
func (r *report) failed() bool {
	s := r.Scenarios
	return (s.Publish != nil && s.Publish.Error != "") ||
		(s.Req != nil && s.Req.Error != "") ||
		(s.Fanout != nil && s.Fanout.Error != "")
}

func main() {
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

// run executes the selected scenarios in order: publish first so that its
// events usually cover the req scenario's seed.
func run(ctx context.Context, o options) *report {
	rep := &report{URL: o.url, RunID: o.runID, StartedAt: time.Now().UTC(), GoMaxProcs: runtime.GOMAXPROCS(0)}
	if o.runs("publish") && ctx.Err() == nil {
		rep.Scenarios.Publish = runPublish(ctx, o)
	}
	if o.runs("req") && ctx.Err() == nil {
		rep.Scenarios.Req = runReq(ctx, o)
	}
	if o.runs("fanout") && ctx.Err() == nil {
		rep.Scenarios.Fanout = runFanout(ctx, o)
	}
	return rep
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
