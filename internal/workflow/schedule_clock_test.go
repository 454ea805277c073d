package workflow_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// A relay process whose clock runs ten minutes ahead of its database's
// (the sessions' now() is set ten minutes behind the wall clock) ticks an
// every-minute schedule saved three minutes earlier by the database's
// clock, twice, around a tick of a second process on the test's stubbed
// clock (which its statement reads as now(): nothing is due to it). A slot
// is due by the database's clock, as the save it is compared with and
// every run's times are: the process ahead fires the three slots due and
// none before its time.
// No slot can fire twice whatever the clocks (one claim row per slot
// second), but a slot fired early fires before a re-save or a disabling
// the owner made in time, and the re-saved schedule then loses that slot.
//
// Mutation killed: slots due by the relay's own clock (as before): the
// process ahead fires the ten slots of the next ten minutes at once,
// beside the three due.
func TestScheduleSlotsAreDueByTheDatabaseClock(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, err := f.pool.Exec(f.ctx, `
		CREATE SCHEMA skew;
		CREATE FUNCTION skew.now() RETURNS timestamptz LANGUAGE plpgsql STABLE AS
		$$BEGIN RETURN pg_catalog.now() - interval '10 minutes'; END$$`)
	require.NoError(t, err)
	behind := dbtest.PoolOn(t, f.pool.Config().ConnString(), 4, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["search_path"] = "skew,pg_catalog,public"
	})
	// The test's clock (the pipeline's, which dates the save) is the
	// database's; the schedule was saved three minutes ago by it.
	f.clock.Advance(-13 * time.Minute)

	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Minutely\ntrigger: {on: schedule, interval: 1m}\nsteps: [{id: say, action: send_message, text: tick}]")

	ahead := workflow.NewScheduler(behind, clock.Wall(), time.Hour, nil, nil)
	agreeing := workflow.NewScheduler(behind, clock.Stub(f.clock.Now), time.Hour, nil, nil)
	for _, s := range []*workflow.Scheduler{ahead, agreeing, ahead} {
		_, err := s.Tick(f.ctx)
		require.NoError(t, err)
	}
	var early, fires, distinct int
	require.NoError(t, behind.QueryRow(f.ctx, `
		SELECT count(*) FILTER (WHERE scheduled_for > now()), count(*), count(DISTINCT scheduled_for)
		FROM scheduled_workflow_fires WHERE workflow_id = $1`, id).Scan(&early, &fires, &distinct))
	t.Logf("slots fired: %d, before their time by the database's clock: %d", fires, early)
	require.Zero(t, early, "no slot fires before its time by the database's clock")
	require.GreaterOrEqual(t, fires, 3, "the slots of the three minutes since the save fire")
	require.Equal(t, fires, distinct, "no slot fires twice")
}
