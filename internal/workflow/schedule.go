package workflow

import (
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"hash/fnv"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/robfig/cron/v3"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/outage"
)

// DefaultCatchUp is how far back a tick looks for schedule slots: a slot
// missed because every relay process was down for less than this still
// fires once when one comes back.
const DefaultCatchUp = 10 * time.Minute

// Scheduler fires schedule-triggered workflows. Slots are whole Unix
// seconds: an interval fires at every multiple of its length since the
// epoch, a cron expression at each of its occurrences (UTC). Every slot is
// claimed in scheduled_workflow_fires before its run is created, in one
// transaction, so across any number of relay processes a slot fires at
// most once; and since each tick looks back over the catch-up window, it
// fires at least once while some process is up within that window.
type Scheduler struct {
	pool    *pgxpool.Pool
	clock   clock.Clock
	catchUp time.Duration
	offer   func(community uuid.UUID, ids []uuid.UUID)
	log     *slog.Logger
	// Metrics records schedule lag and runs that end at the scheduler
	// (refused at capacity, approvals expired); may be nil.
	Metrics *Metrics
	// MaxUnfinishedRuns bounds each workflow's unfinished runs; a slot
	// beyond it records its run failed with capacity_exceeded (0: the
	// default).
	MaxUnfinishedRuns int
	// RunRetention is how long ended runs and slot claims are kept; each
	// tick deletes a batch of older ones (0: DefaultRunRetention).
	RunRetention time.Duration
	// MaxSlotsPerCommunity bounds the slots one tick fires for one
	// community, all its workflows together (0: MaxSlotsPerTick).
	MaxSlotsPerCommunity int
	// MinScheduleInterval is the save's minimum (0: MinScheduleInterval):
	// a cron stored before it was enforced, firing more often than a save
	// allows today, fires only its first slot of each such span.
	MinScheduleInterval time.Duration
	// Outage logs a tick failed by an unreachable database once per
	// outage, not once per tick (nil: every failure is logged).
	Outage *outage.Log

	// handled is, per workflow, the latest slot this scheduler claimed or
	// found claimed: later ticks start after it, so a slot is inserted
	// once per process, not once per tick for as long as it stays in the
	// catch-up window. Only Tick touches it (one goroutine).
	handled map[scheduledWorkflow]time.Time
	// schedules is, per workflow, its schedule decoded from the definition
	// of the event it is pinned to: a tick (every second, on every
	// process) decoded every scheduled workflow's stored definition and
	// parsed its cron expression again, 23 µs for a 3-step definition and
	// 257 µs for 50 steps (BenchmarkScheduleTickDecode). A save pins a new
	// event, so the event id says when to decode again. Only Tick touches
	// it.
	schedules map[scheduledWorkflow]decodedSchedule
	decoded   int // schedules decoded (tests read it)
	// warnedFrequent is the workflows whose too-frequent cron was logged,
	// once per process rather than at every re-decode.
	warnedFrequent map[scheduledWorkflow]bool
}

// decodedSchedule is a workflow's schedule as of its pinned definition
// event.
type decodedSchedule struct {
	eventID string
	firing  bool // the definition decodes and is enabled
	trigger Trigger
	cron    cron.Schedule // nil for an interval, or a cron that does not parse
	// thinTo, when set, fires only the first slot of each span of this
	// length: the cron fires more often, which a save refuses today but
	// did not always.
	thinTo time.Duration
}

// cronMinGap is the shortest gap a cron saved today may leave between two
// slots: the save's minimum, at most a minute (checkScheduleGap).
func (s *Scheduler) cronMinGap() time.Duration {
	minSchedule := s.MinScheduleInterval
	if minSchedule <= 0 {
		minSchedule = MinScheduleInterval
	}
	return min(minSchedule, time.Minute)
}

// scheduledWorkflow is a workflow's key: its community and id.
type scheduledWorkflow struct{ community, id uuid.UUID }

// NewScheduler returns a scheduler; offer (may be nil) receives the ids of
// the runs a tick created, after commit.
func NewScheduler(pool *pgxpool.Pool, clk clock.Clock, catchUp time.Duration, offer func(uuid.UUID, []uuid.UUID), log *slog.Logger) *Scheduler {
	if catchUp <= 0 {
		catchUp = DefaultCatchUp
	}
	if log == nil {
		log = slog.Default()
	}
	return &Scheduler{pool: pool, clock: clk, catchUp: catchUp, offer: offer, log: log}
}

// Run ticks every interval until ctx ends; each tick also expires
// approvals nobody decided in time and deletes a batch of history older
// than RunRetention.
func (s *Scheduler) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := s.Tick(ctx); err != nil && ctx.Err() == nil && !s.Outage.TickFailed(err, "workflow schedule tick") {
			s.log.Error("workflow schedule tick failed", "err", err)
		}
		if _, err := ExpireApprovals(ctx, s.pool, s.clock, s.Metrics, s.log); err != nil && ctx.Err() == nil && !s.Outage.TickFailed(err, "workflow approval expiry") {
			s.log.Error("workflow approval expiry failed", "err", err)
		}
		if _, _, err := PruneHistory(ctx, s.pool, s.clock, s.runRetention(), s.Metrics); err != nil && ctx.Err() == nil && !s.Outage.TickFailed(err, "workflow history retention") {
			s.log.Error("workflow history retention failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Scheduler) runRetention() time.Duration {
	if s.RunRetention > 0 {
		return s.RunRetention
	}
	return DefaultRunRetention
}

// MaxSlotsPerTick bounds the slots one tick fires for one workflow, so a
// long catch-up window over a frequent schedule costs a bounded amount of
// work per tick; the slots beyond it fire on the next ticks.
const MaxSlotsPerTick = 100

// Slots returns the slots of a schedule trigger in (after, until], oldest
// first, at most MaxSlotsPerTick of them.
func Slots(t Trigger, after, until time.Time) []time.Time {
	var sched cron.Schedule
	if t.Cron != "" {
		var err error
		if sched, err = CronSchedule(t.Cron); err != nil {
			return nil
		}
	}
	return slotsOf(t, sched, 0, after, until)
}

// slotsOf is Slots with t's cron expression parsed (sched); a thinTo span
// keeps only the cron's first slot of each span (spans counted from Go's
// zero time, so whole minutes for a minute), the same slots on every
// process whatever after is.
func slotsOf(t Trigger, sched cron.Schedule, thinTo time.Duration, after, until time.Time) []time.Time {
	var out []time.Time
	if t.Cron != "" {
		if sched == nil {
			return nil
		}
		// Next answers the zero time when no date matches within five
		// years: the schedule has no more slots.
		for next := sched.Next(after.UTC()); !next.IsZero() && !next.After(until) && len(out) < MaxSlotsPerTick; {
			if thinTo <= 0 {
				out = append(out, next)
				next = sched.Next(next)
				continue
			}
			span := next.Truncate(thinTo)
			if sched.Next(span.Add(-time.Second)).Equal(next) {
				out = append(out, next)
			}
			next = sched.Next(span.Add(thinTo - time.Second))
		}
		return out
	}
	step := int64(t.IntervalDuration() / time.Second)
	if step <= 0 {
		return nil
	}
	first := (after.Unix()/step + 1) * step
	for slot := first; slot <= until.Unix() && len(out) < MaxSlotsPerTick; slot += step {
		out = append(out, time.Unix(slot, 0).UTC())
	}
	return out
}

// Tick claims and fires every due slot in the catch-up window and returns
// how many runs it created.
func (s *Scheduler) Tick(ctx context.Context) (int, error) {
	rows, err := db.New(s.pool).WorkflowsScheduled(ctx, s.clock.SQL())
	if err != nil {
		return 0, err
	}
	// Slots are due by the database's clock, as the save time they are
	// compared with and every run's times are: on a relay's clock ahead of
	// it, a slot fired before its time, before a re-save or a disabling
	// made in time.
	var now time.Time
	if len(rows) > 0 {
		now = rows[0].Now.Truncate(time.Second)
	}
	created := 0
	handled := make(map[scheduledWorkflow]time.Time, len(rows))
	defer func() { s.handled = handled }()
	schedules := make(map[scheduledWorkflow]decodedSchedule, len(rows))
	defer func() { s.schedules = schedules }()
	perCommunity := s.MaxSlotsPerCommunity
	if perCommunity <= 0 {
		perCommunity = MaxSlotsPerTick
	}
	// The slots of one community's workflows (rows come ordered by
	// community), fired oldest first up to perCommunity once the
	// community's last row is read.
	type due struct {
		row  int
		slot time.Time
		tie  uint64 // slotTieBreak
	}
	var pending []due
	fireCommunity := func() error {
		slices.SortFunc(pending, func(a, b due) int {
			if c := a.slot.Compare(b.slot); c != 0 {
				return c
			}
			return cmp.Compare(a.tie, b.tie)
		})
		pending = pending[:min(len(pending), perCommunity)]
		failed := map[int]bool{}
		for _, d := range pending {
			row := rows[d.row]
			if failed[d.row] {
				continue
			}
			id, err := s.fire(ctx, row, d.slot)
			if err != nil {
				if ctx.Err() != nil {
					return err
				}
				// One workflow's failure must not stop every other
				// schedule; its unclaimed slot is tried again next tick.
				s.log.Error("workflow schedule slot failed", "workflow_id", row.ID, "slot", d.slot, "err", err)
				failed[d.row] = true
				continue
			}
			handled[scheduledWorkflow{row.CommunityID, row.ID}] = d.slot
			if id != uuid.Nil {
				created++
				if s.offer != nil {
					s.offer(row.CommunityID, []uuid.UUID{id})
				}
			}
		}
		pending = pending[:0]
		return nil
	}
	for i, row := range rows {
		if i > 0 && row.CommunityID != rows[i-1].CommunityID {
			if err := fireCommunity(); err != nil {
				return created, err
			}
		}
		key := scheduledWorkflow{row.CommunityID, row.ID}
		sched := s.scheduleOf(key, row)
		schedules[key] = sched
		if !sched.firing || row.ChannelID == nil {
			continue
		}
		// A slot before the definition was saved belongs to no schedule the
		// owner signed: a new every-minute schedule must not fire the whole
		// catch-up window at once, nor a re-saved one its old cadence.
		after := now.Add(-s.catchUp)
		if row.UpdatedAt.After(after) {
			after = row.UpdatedAt
		}
		if last, ok := s.handled[key]; ok {
			handled[key] = last
			if last.After(after) {
				after = last
			}
		}
		for _, slot := range slotsOf(sched.trigger, sched.cron, sched.thinTo, after, now) {
			pending = append(pending, due{row: i, slot: slot, tie: slotTieBreak(row.ID, slot)})
		}
	}
	if err := fireCommunity(); err != nil {
		return created, err
	}
	return created, nil
}

// scheduleOf is the schedule of row's workflow: the one decoded at an
// earlier tick if the workflow is still pinned to the same event, else
// decoded now.
func (s *Scheduler) scheduleOf(key scheduledWorkflow, row db.WorkflowsScheduledRow) decodedSchedule {
	eventID := string(row.DefinitionEventID)
	if kept, ok := s.schedules[key]; ok && kept.eventID == eventID {
		return kept
	}
	s.decoded++
	sched := decodedSchedule{eventID: eventID}
	var trigger Trigger
	if !row.DefinitionEnabled || json.Unmarshal(row.Trigger, &trigger) != nil {
		return sched
	}
	sched.firing, sched.trigger = true, trigger
	if trigger.Cron != "" {
		sched.cron, _ = CronSchedule(trigger.Cron) // nil: no slots, as Slots
		if spec, ok := sched.cron.(*cron.SpecSchedule); ok && cronGap(spec) < s.cronMinGap() {
			// Saved before such crons were refused: fired as saved, a
			// per-second cron made 86,400 runs a day.
			sched.thinTo = s.cronMinGap()
			if s.warnedFrequent == nil {
				s.warnedFrequent = map[scheduledWorkflow]bool{}
			}
			if !s.warnedFrequent[key] {
				s.warnedFrequent[key] = true
				s.log.Warn("workflow cron fires more often than a save allows; firing only its first slot of each span (save it again to change it)",
					"community_id", row.CommunityID, "workflow_id", row.ID, "cron", trigger.Cron, "span", sched.thinTo)
			}
		}
	}
	return sched
}

// slotTieBreak orders slots of one second past a community's bound. By
// workflow id, the order every process reads them in, a member could pick
// low ids (the d tag is theirs) and win every tie: once a community's
// backlog reaches the catch-up window's edge, the others' slots of each
// second would fall out of it, every second. Hashed with the slot, the
// winner changes from second to second, and every process agrees on it.
func slotTieBreak(workflow uuid.UUID, slot time.Time) uint64 {
	h := fnv.New64a()
	h.Write(workflow[:])
	// FNV's high bits barely move with its last bytes, so the slot is
	// mixed in after it (the splitmix64 finalizer): the order must change
	// with every second.
	x := h.Sum64() ^ uint64(slot.Unix())
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// fire claims one slot and creates its run in the same transaction; it
// returns uuid.Nil when the slot was already claimed or its run was refused
// at capacity (recorded failed, and the slot stays claimed: a refused slot
// is not fired again).
func (s *Scheduler) fire(ctx context.Context, row db.WorkflowsScheduledRow, slot time.Time) (uuid.UUID, error) {
	runID := uuid.Nil
	claimed, queued := false, false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		n, err := q.ScheduledWorkflowFireClaim(ctx, db.ScheduledWorkflowFireClaimParams{
			CommunityID: row.CommunityID, WorkflowID: row.ID, ScheduledFor: slot, Now: s.clock.SQL(),
		})
		if err != nil || n == 0 {
			return err
		}
		ref := strconv.FormatInt(slot.Unix(), 10)
		tc := TriggerContext{
			ChannelID:         row.ChannelID.String(),
			Timestamp:         ref,
			WebhookFields:     map[string]string{},
			DefinitionEventID: hex.EncodeToString(row.DefinitionEventID),
			Cause:             Cause{Kind: CauseSchedule, Ref: ref},
		}
		id, ok, err := admitRun(ctx, q, newRun{CommunityID: row.CommunityID, WorkflowID: row.ID, Context: tc, Now: s.clock.SQL()}, s.MaxUnfinishedRuns)
		if err != nil {
			return err
		}
		if err := q.ScheduledWorkflowFireLink(ctx, db.ScheduledWorkflowFireLinkParams{
			RunID: id, CommunityID: row.CommunityID, WorkflowID: row.ID, ScheduledFor: slot,
		}); err != nil {
			return err
		}
		claimed, queued = true, ok
		if ok {
			runID = id
		}
		return nil
	})
	if err != nil {
		return uuid.Nil, err
	}
	if claimed {
		// Observed once committed: a rolled-back claim fires later, and is
		// measured then. On the database's clock, as the slot is.
		s.Metrics.slotClaimed(row.Now.Sub(slot))
		if !queued {
			s.Metrics.refusedAtCapacity()
		}
	}
	return runID, nil
}
