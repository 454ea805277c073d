package workflow

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// Worker limits. The hand-off only speeds up the first step: a run that
// does not fit is found by the poll, so the channel stays small.
const (
	handoffCapacity = 64
	claimErrorSleep = time.Second
)

// WorkerOptions are a worker's settings.
type WorkerOptions struct {
	// MaxInFlight is how many runs one worker executes at once.
	MaxInFlight int
	// Poll is how often an idle worker looks for due runs (delays ending,
	// runs created by another process, leases expired).
	Poll time.Duration
	// CommunityShare is how many runs of one community the worker takes
	// while others wait (default: half of MaxInFlight, at least one).
	CommunityShare int
}

// communityShares returns the share of the worker's runs one community
// may hold before the runs of others go first, and the reserve of slots
// kept for those: beyond its share, a community's runs fill free slots
// only while the reserve stays free.
func (o WorkerOptions) communityShares() (share, reserve int) {
	share = o.CommunityShare
	if share <= 0 {
		share = max(1, o.MaxInFlight/2)
	}
	return share, o.MaxInFlight / 10
}

// Defaults for WorkerOptions left zero (the relay's configuration sets them).
const (
	DefaultMaxInFlight = 100
	DefaultPoll        = time.Second
)

// Worker runs an Engine: claimed runs from hand-offs (runs this process
// just created) and from the poll, at most MaxInFlight at a time.
type Worker struct {
	engine  *Engine
	opts    WorkerOptions
	handoff chan runRef
}

// runRef names a run by its primary key, which the hand-off's claim looks
// up: by id alone it read the whole key, every run of every community.
type runRef struct{ community, id uuid.UUID }

// NewWorker returns a worker over e.
func NewWorker(e *Engine, opts WorkerOptions) *Worker {
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = DefaultMaxInFlight
	}
	if opts.Poll <= 0 {
		opts.Poll = DefaultPoll
	}
	return &Worker{engine: e, opts: opts, handoff: make(chan runRef, handoffCapacity)}
}

// Offer hands the ids of committed runs of community to the worker without
// blocking; ids that do not fit are left to the poll. Call it only after the
// transaction that created the runs committed. A nil Worker takes nothing.
func (w *Worker) Offer(community uuid.UUID, ids []uuid.UUID) {
	if w == nil {
		return
	}
	for _, id := range ids {
		select {
		case w.handoff <- runRef{community, id}:
		default:
			return
		}
	}
}

// Run executes runs until ctx ends, then waits for the runs in flight.
// Runs in flight finish their current step on shutdown (their context is
// detached), so a step is never cut between its effect and its record.
//
// The worker's slots are shared by every community of the process, and runs
// are claimed oldest first, so one community's backlog of slow runs (each
// of its 50 steps may wait 10 s for a webhook) took every slot and the
// others' runs waited behind it, for hours. A community therefore holds at
// most its share of the slots while others have due runs: a claim first
// takes runs of communities under their share, each up to its room; only
// what is left, less a reserve, goes to the communities at their share.
func (w *Worker) Run(ctx context.Context) {
	done := make(chan uuid.UUID, w.opts.MaxInFlight)
	inflight := 0
	share, reserve := w.opts.communityShares()
	shares := claimShares{share: share, held: map[uuid.UUID]int{}}
	execCtx := context.WithoutCancel(ctx)
	start := func(claims []Claimed) {
		for _, c := range claims {
			inflight++
			shares.held[c.Run.CommunityID]++
			go func() {
				defer func() { done <- c.Run.CommunityID }()
				w.engine.execute(execCtx, ctx.Done(), c)
			}()
		}
	}
	finished := func(community uuid.UUID) {
		inflight--
		if shares.held[community]--; shares.held[community] <= 0 {
			delete(shares.held, community)
		}
	}
	atShare := func() bool {
		for _, n := range shares.held {
			if n >= share {
				return true
			}
		}
		return false
	}
	poll := time.NewTimer(0)
	defer poll.Stop()
	// passedOver: the last poll came back empty while a community was at
	// its share, so runs may be due that only a free slot lets this worker
	// take (that community's beyond its share, once the reserve is free).
	// A run ending frees one: poll then, not at the next Poll.
	passedOver := false
	for {
		free := w.opts.MaxInFlight - inflight
		var pollC <-chan time.Time
		var handoffC <-chan runRef
		if free > 0 {
			pollC, handoffC = poll.C, w.handoff
		}
		select {
		case <-ctx.Done():
			for ; inflight > 0; inflight-- {
				<-done
			}
			return
		case community := <-done:
			finished(community)
			if passedOver {
				passedOver = false
				poll.Reset(0)
			}
		case <-pollC:
			claims, err := w.engine.claimDue(ctx, free, shares)
			start(claims)
			if rest := free - reserve; err == nil && len(claims) == 0 && rest > 0 && atShare() {
				// Nobody under their share has runs due (a claim that took
				// some may not have seen them all: the poll comes again at
				// once): fill the slots they do not need, keeping the
				// reserve for them.
				var more []Claimed
				more, err = w.engine.claimDue(ctx, rest, claimShares{})
				start(more)
				claims = append(claims, more...)
			}
			switch {
			case err != nil:
				if ctx.Err() == nil && !w.engine.outage.TickFailed(err, "workflow run poll") {
					w.engine.log.Error("workflow run poll failed", "err", err)
				}
				poll.Reset(claimErrorSleep)
			case len(claims) > 0:
				passedOver = false
				poll.Reset(0)
			default:
				passedOver = atShare()
				poll.Reset(w.opts.Poll)
			}
		case ref := <-handoffC:
			ids := []runRef{ref}
			for len(ids) < free {
				select {
				case more := <-w.handoff:
					ids = append(ids, more)
					continue
				default:
				}
				break
			}
			claims, err := w.engine.claimByID(ctx, ids, shares)
			if err != nil {
				w.engine.log.Debug("workflow hand-off claim failed", "ids", len(ids), "err", err)
			}
			start(claims)
			if err == nil && len(claims) < len(ids) && atShare() {
				// Runs of a community holding its share were passed over:
				// whether free slots beyond the shares go to them is the
				// poll's to decide, now rather than at the next Poll.
				poll.Reset(0)
			}
		}
	}
}
