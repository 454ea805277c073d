package workflow_test

import (
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
)

func TestScheduleSlots(t *testing.T) {
	t.Parallel()
	at := func(s int64) time.Time { return time.Unix(s, 0).UTC() }
	every := workflow.Trigger{On: workflow.OnSchedule, Interval: "90s"}
	require.Equal(t, []time.Time{at(180), at(270), at(360)}, workflow.Slots(every, at(100), at(400)), "epoch-aligned, window end included")
	require.Equal(t, []time.Time{at(270)}, workflow.Slots(every, at(180), at(359)), "window start excluded")
	cron := workflow.Trigger{On: workflow.OnSchedule, Cron: "0 */2 * * * * *"}
	require.Equal(t, []time.Time{at(120), at(240)}, workflow.Slots(cron, at(60), at(300)))
}

// Three relay processes' schedulers tick at once on one database: every
// slot in the window gets exactly one run, linked from its claim row, with
// the slot as its cause. Later ticks fire nothing more.
//
// Mutation killed: creating the run without checking the claim (n == 0
// ignored) gives three runs per slot; checked by "one run per slot".
func TestScheduleSlotFiresOnceAcrossProcesses(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Tick\ntrigger: {on: schedule, interval: 60s}\nsteps: [{id: a, action: send_message, text: tick}]")

	const window = 5 * time.Minute
	f.clock.Advance(window) // every process was down since the save
	var wg sync.WaitGroup
	for range 3 {
		s := workflow.NewScheduler(f.pool, clock.Stub(f.clock.Now), window, nil, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Tick(f.ctx)
			require.NoError(t, err)
		}()
	}
	wg.Wait()
	slots := workflow.Slots(workflow.Trigger{Interval: "60s"}, f.clock.Now().Truncate(time.Second).Add(-window), f.clock.Now())
	require.Len(t, slots, 5)
	require.Equal(t, len(slots), f.count(`SELECT count(*) FROM workflow_runs WHERE workflow_id = $1`, id), "one run per slot")
	require.Equal(t, len(slots), f.count(`SELECT count(*) FROM scheduled_workflow_fires f JOIN workflow_runs r ON r.id = f.workflow_run_id
		WHERE f.workflow_id = $1 AND r.trigger_context -> 'cause' ->> 'ref' = extract(epoch FROM f.scheduled_for)::bigint::text
		  AND r.trigger_context -> 'cause' ->> 'kind' = 'schedule'`, id))

	n, err := workflow.NewScheduler(f.pool, clock.Stub(f.clock.Now), window, nil, nil).Tick(f.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a fired slot never fires again")

	// Every process was down for three minutes: the missed slots fire
	// once when one comes back; nothing older than the window does.
	f.clock.Advance(3 * time.Minute)
	n, err = workflow.NewScheduler(f.pool, clock.Stub(f.clock.Now), window, nil, nil).Tick(f.ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	f.drain(f.engine(time.Minute))
	require.Equal(t, 8, f.count(`SELECT count(*) FROM workflow_runs WHERE workflow_id = $1 AND status = 'completed'`, id))
}

// Every slot a tick fires is observed in buzz_workflow_schedule_lag_seconds
// on the engine's registry, with its lag: how long after the slot the
// claim committed (the clock is the test's, so the sum is exact). A slot
// already fired is not observed again.
//
// Mutation killed: dropping the observation (or observing before the
// claim is known to have won) fails the count.
func TestScheduleLagIsObserved(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Tick\ntrigger: {on: schedule, interval: 60s}\nsteps: [{id: a, action: send_message, text: tick}]")
	const window = 3 * time.Minute
	f.clock.Advance(window)
	s := workflow.NewScheduler(f.pool, clock.Stub(f.clock.Now), window, nil, nil)
	s.Metrics = f.metrics
	now := f.clock.Now().Truncate(time.Second)
	slots := workflow.Slots(workflow.Trigger{Interval: "60s"}, now.Add(-window), now)
	require.Len(t, slots, 3)
	var wantSum float64
	for _, slot := range slots {
		wantSum += f.clock.Now().Sub(slot).Seconds()
	}
	n, err := s.Tick(f.ctx)
	require.NoError(t, err)
	require.Equal(t, len(slots), n)
	n, err = s.Tick(f.ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	count, err := testutil.GatherAndCount(f.reg, "buzz_workflow_schedule_lag_seconds")
	require.NoError(t, err)
	require.Equal(t, 1, count, "one series")
	families, err := f.reg.Gather()
	require.NoError(t, err)
	var h *dto.Histogram
	for _, fam := range families {
		if fam.GetName() == "buzz_workflow_schedule_lag_seconds" {
			h = fam.GetMetric()[0].GetHistogram()
		}
	}
	require.NotNil(t, h)
	require.Equal(t, uint64(len(slots)), h.GetSampleCount(), "each fired slot once")
	require.InDelta(t, wantSum, h.GetSampleSum(), 1e-9)
}

// A schedule fires only slots after its definition was saved: saving an
// every-minute schedule fires nothing from the catch-up window before it,
// and a re-save starts again from the re-save.
//
// Mutation killed: ticking over the whole catch-up window (ignoring
// updated_at) fires ten slots on the first tick.
func TestScheduleFiresNoSlotBeforeItsSave(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	const window = 10 * time.Minute
	tick := func() int {
		n, err := workflow.NewScheduler(f.pool, clock.Stub(f.clock.Now), window, nil, nil).Tick(f.ctx)
		require.NoError(t, err)
		return n
	}
	f.save(owner, ch, id, "name: Tick\ntrigger: {on: schedule, interval: 60s}\nsteps: [{id: a, action: send_message, text: tick}]")
	require.Zero(t, tick(), "no slot before the save")
	f.clock.Advance(2 * time.Minute)
	require.Equal(t, 2, tick())

	f.clock.Advance(3 * time.Minute) // three slots missed, then a re-save
	f.save(owner, ch, id, "name: Tock\ntrigger: {on: schedule, interval: 60s}\nsteps: [{id: a, action: send_message, text: tock}]")
	require.Zero(t, tick(), "the slots missed before the re-save are not fired")
	f.clock.Advance(time.Minute)
	require.Equal(t, 1, tick())
}

// A cron expression that names no real date has no slots: the cron
// library answers the zero time after five years of searching, which is
// not a slot. A window holding more slots than MaxSlotsPerTick yields
// only that many, oldest first.
//
// Mutation killed: dropping the zero-time stop in Slots returns
// MaxSlotsPerTick zero times (and, without the cap, never returns);
// dropping the cap returns a day's worth of per-second slots.
func TestScheduleSlotsStopAtNoFiringAndAtTheCap(t *testing.T) {
	t.Parallel()
	at := func(s int64) time.Time { return time.Unix(s, 0).UTC() }
	for _, never := range []string{"0 0 0 30 2 * *", "0 0 0 31 4 * *"} {
		require.Zero(t, len(workflow.Slots(workflow.Trigger{On: workflow.OnSchedule, Cron: never}, at(0), at(400*86400))), never)
	}
	everySecond := workflow.Trigger{On: workflow.OnSchedule, Cron: "* * * * * * *"}
	slots := workflow.Slots(everySecond, at(1000), at(1000+86400))
	require.Equal(t, workflow.MaxSlotsPerTick, len(slots))
	require.Equal(t, at(1001), slots[0], "oldest first")
	everyMinute := workflow.Trigger{On: workflow.OnSchedule, Interval: "60s"}
	require.Equal(t, workflow.MaxSlotsPerTick, len(workflow.Slots(everyMinute, at(0), at(365*86400))))
}

// One workflow whose slot cannot be recorded does not stop the tick: the
// other workflows' slots still fire, and the tick reports no error.
//
// Mutation killed: returning the first fire error from Tick (as before)
// leaves the second workflow without its runs.
func TestScheduleTickSurvivesOneFailingWorkflow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	// Ticks visit workflows in id order: the failing one comes first.
	failing, healthy := "00000000-0000-4000-8000-000000000001", "ffffffff-ffff-4fff-bfff-ffffffffffff"
	for _, id := range []string{failing, healthy} {
		f.save(owner, ch, id, "name: Tick\ntrigger: {on: schedule, interval: 60s}\nsteps: [{id: a, action: send_message, text: tick}]")
	}
	_, err := f.pool.Exec(f.ctx, `
		CREATE FUNCTION test_refuse_fire() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'refused by test'; END $$;
		CREATE TRIGGER test_refuse_fire BEFORE INSERT ON scheduled_workflow_fires FOR EACH ROW
		WHEN (NEW.workflow_id = '`+failing+`') EXECUTE FUNCTION test_refuse_fire();`)
	require.NoError(t, err)
	f.clock.Advance(3 * time.Minute)
	n, err := workflow.NewScheduler(f.pool, clock.Stub(f.clock.Now), 10*time.Minute, nil, nil).Tick(f.ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, 3, f.count(`SELECT count(*) FROM workflow_runs WHERE workflow_id = $1`, healthy))
	require.Zero(t, f.count(`SELECT count(*) FROM workflow_runs WHERE workflow_id = $1`, failing))
}

// A scheduler does not claim again the slots it already handled: a
// window of more than MaxSlotsPerTick slots (a per-second cron, a long
// catch-up) fires in chunks over
// successive ticks, each tick starting after the last slot it handled,
// and a tick with nothing new inserts nothing.
//
// Mutation killed: ignoring the handled mark makes the second tick claim
// the first chunk again and fire nothing (the newer slots starve), and
// the idle tick insert every slot of the window again.
func TestScheduleTickResumesAfterTheLastHandledSlot(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Tick\ntrigger: {on: schedule, cron: '* * * * * *'}\nsteps: [{id: a, action: send_message, text: tick}]")
	_, err := f.pool.Exec(f.ctx, `
		CREATE TABLE test_fire_attempts (n int);
		CREATE FUNCTION test_count_fire() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO test_fire_attempts VALUES (1); RETURN NEW; END $$;
		CREATE TRIGGER test_count_fire BEFORE INSERT ON scheduled_workflow_fires FOR EACH ROW EXECUTE FUNCTION test_count_fire();`)
	require.NoError(t, err)
	const window = 10 * time.Minute
	f.clock.Advance(250 * time.Second)
	s := workflow.NewScheduler(f.pool, clock.Stub(f.clock.Now), window, nil, nil)
	s.MinScheduleInterval = time.Second // the fixture saves per-second crons
	var fired []int
	for range 4 {
		n, err := s.Tick(f.ctx)
		require.NoError(t, err)
		fired = append(fired, n)
	}
	require.Equal(t, []int{100, 100, 50, 0}, fired)
	require.Equal(t, 250, f.count(`SELECT count(*) FROM test_fire_attempts`), "each slot inserted once")
}

// An archived community's schedules do not fire (it is not served), and
// fire again once it is unarchived; a community whose deletion has begun
// fires nothing.
//
// Mutation killed: the scheduler's query ignoring archived_at (the
// archived tick fires). Without its deletion_state test the quiescing tick
// still fires nothing: the write fence refuses the slot's claim.
func TestScheduleSkipsArchivedAndDeletingCommunities(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	f.save(owner, ch, uuid.NewString(), "name: Tick\ntrigger: {on: schedule, interval: 60s}\nsteps: [{id: a, action: send_message, text: tick}]")
	tick := func() int {
		n, err := workflow.NewScheduler(f.pool, clock.Stub(f.clock.Now), time.Minute, nil, nil).Tick(f.ctx)
		require.NoError(t, err)
		return n
	}
	community := func(set string) {
		_, err := f.pool.Exec(f.ctx, `UPDATE communities SET `+set+` WHERE id = $1`, f.tenant.ID())
		require.NoError(t, err)
	}

	community(`archived_at = now()`)
	f.clock.Advance(time.Minute)
	require.Zero(t, tick(), "an archived community fires nothing")
	community(`archived_at = NULL`)
	f.clock.Advance(time.Minute)
	require.Equal(t, 1, tick(), "unarchived, it fires again")
	quiesce(t, f, f.tenant.Host())
	f.clock.Advance(time.Minute)
	require.Zero(t, tick(), "a community being deleted fires nothing")
}

// One community's schedules cannot hold up another's: a tick fires at most
// MaxSlotsPerCommunity slots of one community, its workflows together,
// oldest first, so the tick's work per community is bounded and a
// community with a few quiet schedules gets them fired in the same tick
// however many per-second schedules another saved. The slots left over
// fire at the next ticks.
//
// Mutation killed: firing every workflow's slots without the community
// bound (as before) fires all 30 of A's slots in the first tick.
func TestScheduleTickBoundsEachCommunitysSlots(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	var aWorkflows []string
	for range 3 {
		id := uuid.NewString()
		aWorkflows = append(aWorkflows, id)
		f.save(owner, ch, id, "name: Busy\ntrigger: {on: schedule, cron: '* * * * * *'}\nsteps: [{id: a, action: send_message, text: tick}]")
	}
	row, err := db.New(f.pool).CommunityCreate(f.ctx, "wf-b-"+uuid.NewString()[:8]+".example")
	require.NoError(t, err)
	b := community.FromRow(row)
	bOwner, bChannel, quiet := f.key(), uuid.NewString(), uuid.NewString()
	for _, ev := range []*nostr.Event{
		f.sign(bOwner, ingest.KindCreateGroup, "", nostr.Tags{{"h", bChannel}, {"name", "b"}}),
		f.sign(bOwner, workflow.KindDefinition, "name: Quiet\ntrigger: {on: schedule, cron: '* * * * * *'}\nsteps: [{id: a, action: send_message, text: tick}]", nostr.Tags{{"d", quiet}, {"h", bChannel}}),
	} {
		out, _, err := f.p.SubmitReply(f.ctx, b, ev.PubKey, ev)
		require.NoError(t, err)
		require.Equal(t, ingest.Stored, out)
	}
	f.clock.Advance(10 * time.Second)
	aSlots := 3 * 10
	bSlots := 10

	s := workflow.NewScheduler(f.pool, clock.Stub(f.clock.Now), time.Minute, nil, nil)
	s.MinScheduleInterval = time.Second // the fixture saves per-second crons
	s.MaxSlotsPerCommunity = 12
	runs := func(community uuid.UUID) int {
		return f.count(`SELECT count(*) FROM workflow_runs WHERE community_id = $1`, community)
	}
	n, err := s.Tick(f.ctx)
	require.NoError(t, err)
	require.Equal(t, 12+bSlots, n)
	require.Equal(t, 12, runs(f.tenant.ID()), "A fired its bound")
	require.Equal(t, bSlots, runs(b.ID()), "B's slots fired in the same tick")
	// Oldest first across A's workflows: each got its first four seconds.
	for _, id := range aWorkflows {
		require.Equal(t, 4, f.count(`SELECT count(*) FROM workflow_runs WHERE workflow_id = $1`, id))
	}
	for range 2 {
		_, err := s.Tick(f.ctx)
		require.NoError(t, err)
	}
	require.Equal(t, aSlots, runs(f.tenant.ID()), "the rest fired at the next ticks")
}

// Past a community's bound, slots of one second are tied; the winner must
// not be the same workflow every second. With ties going by workflow id (a
// member's own d tag), once the backlog reached the catch-up window's edge
// the higher id lost its slot of every second to the window: it stopped
// firing for good. Mutation killed: ties broken by workflow id (the order
// the rows are read in), under which the high id fires 0 of the last 30
// ticks.
func TestScheduleTiesPastTheBoundAreNotWonByTheLowestID(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	low, high := "00000000-0000-4000-8000-000000000000", "ffffffff-ffff-4fff-bfff-ffffffffffff"
	for _, id := range []string{low, high} {
		f.save(owner, ch, id, "name: Tick\ntrigger: {on: schedule, cron: '* * * * * *'}\nsteps: [{id: a, action: send_message, text: tick}]")
	}
	s := workflow.NewScheduler(f.pool, clock.Stub(f.clock.Now), 10*time.Second, nil, nil)
	s.MinScheduleInterval = time.Second // the fixture saves per-second crons
	s.MaxSlotsPerCommunity = 1          // two slots a second, one fired a tick: a backlog that reaches the window
	fired := func(id string) int { return f.count(`SELECT count(*) FROM workflow_runs WHERE workflow_id = $1`, id) }
	tick := func(n int) {
		for range n {
			f.clock.Advance(time.Second)
			_, err := s.Tick(f.ctx)
			require.NoError(t, err)
		}
	}
	tick(30)
	before := fired(high)
	tick(30)
	require.GreaterOrEqual(t, fired(high)-before, 5, "the high id's slots still fire once the backlog is at the window's edge")
	require.Equal(t, 60, fired(low)+fired(high), "one slot a tick")
}

// A tick decodes a workflow's schedule once per definition event it is
// pinned to, not every tick (every second, on every process: 23 to 257 µs
// per workflow, BenchmarkScheduleTickDecode), and a re-save, which pins a
// new event, is decoded afresh: its new cadence is the one that fires.
// Mutations killed: scheduleOf decoding every tick (decoded counts 3);
// the kept schedule reused whatever the event (the old 60 s cadence fires
// four slots where the new 120 s one fires two).
func TestScheduleIsDecodedOncePerDefinitionEvent(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	s := workflow.NewScheduler(f.pool, clock.Stub(f.clock.Now), 10*time.Minute, nil, nil)
	tick := func() int {
		n, err := s.Tick(f.ctx)
		require.NoError(t, err)
		return n
	}
	f.save(owner, ch, id, "name: Tick\ntrigger: {on: schedule, interval: 60s}\nsteps: [{id: a, action: send_message, text: tick}]")
	require.Zero(t, tick())
	f.clock.Advance(2 * time.Minute)
	require.Equal(t, 2, tick())
	require.Zero(t, tick())
	require.Equal(t, 1, s.SchedulesDecoded(), "three ticks, one decoding")

	f.save(owner, ch, id, "name: Tock\ntrigger: {on: schedule, interval: 120s}\nsteps: [{id: a, action: send_message, text: tock}]")
	require.Zero(t, tick())
	require.Equal(t, 2, s.SchedulesDecoded(), "the re-save is decoded")
	f.clock.Advance(4 * time.Minute)
	require.Equal(t, 2, tick(), "the new cadence fires")
}

// A cron saved before crons firing more than once a minute were refused
// keeps firing, but only its first slot of each minute: the same slots on
// every process, and the same whatever second a tick starts from. The
// stored cron is rewritten to every second, as such a save left it.
// Mutation killed: slots of every second fired (100 runs in the tick, the
// per-community bound, instead of 3, none of them on the minute).
func TestCronSavedFiringEverySecondFiresOnceAMinute(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Minutely\ntrigger: {on: schedule, cron: '0 * * * * *'}\nsteps: [{id: a, action: send_message, text: tick}]")
	_, err := f.pool.Exec(f.ctx, `UPDATE workflows SET definition = jsonb_set(definition, '{trigger,cron}', '"* * * * * * *"') WHERE id = $1`, id)
	require.NoError(t, err)

	f.clock.Advance(3 * time.Minute)
	n, err := workflow.NewScheduler(f.pool, clock.Stub(f.clock.Now), 10*time.Minute, nil, nil).Tick(f.ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n, "one slot a minute")
	require.Zero(t, f.count(`SELECT count(*) FROM scheduled_workflow_fires
		WHERE workflow_id = $1 AND extract(second FROM scheduled_for) <> 0`, id), "each minute's first second")
}
