package workflow_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// A schedule saved fires at most once a minute (BUZZ_WORKFLOW_MIN_SCHEDULE_INTERVAL):
// an interval was refused under 60 s, but a cron expression with seconds
// fired every second, 86,400 runs, run rows and stored messages a day per
// workflow. A cron expression may not fire twice within the minimum (at
// most a minute: one naming a single second fires once a minute), counting
// from the last second of a minute to the first of the next. A definition
// stored before still parses (its runs go on), and a relay set lower
// accepts what its setting allows.
// Mutations killed: no cron check at save; the check without the gap
// across a minute's end (`0,59 * * * * *` accepted); the setting ignored
// (the 2 s relay refuses `*/2`).
func TestScheduleSlotsAreAtLeastAMinuteApart(t *testing.T) {
	t.Parallel()
	def := func(trigger string) string {
		return "name: S\ntrigger: {on: schedule, " + trigger + "}\nsteps: [{id: a, action: send_message, text: tick}]"
	}
	for trigger, want := range map[string]string{
		`cron: '* * * * * *'`:      "trigger.cron: fires every 1s; a schedule fires at most once every 1m0s",
		`cron: '*/30 * * * * *'`:   "fires every 30s",
		`cron: '0,59 * * * * *'`:   "fires every 1s",
		`cron: '0,30 0 * * * * *'`: "fires every 30s",
		`cron: '0-5 0 12 * * *'`:   "fires every 1s",
		`interval: 59s`:            "trigger.interval: must be at least 1m0s",
	} {
		_, err := workflow.ParseForSave(def(trigger))
		require.ErrorContains(t, err, want, trigger)
		_, err = workflow.Parse(def(trigger))
		require.NoError(t, err, "stored before the bound, %s still parses", trigger)
	}
	for _, trigger := range []string{`cron: '* * * * *'`, `cron: '15 * * * * *'`, `cron: '0 */5 * * * *'`,
		`cron: '30 0,59 * * * *'`, `interval: 60s`} {
		_, err := workflow.ParseForSave(def(trigger))
		require.NoError(t, err, trigger)
	}

	// Through a relay's save: refused with the reason under the default,
	// accepted by one set to two seconds.
	f := newFixtureWith(t, ingest.Options{}, workflow.Triggers{})
	owner := f.key()
	ch := f.channel(owner)
	refused := func(f *fixture, ev *nostr.Event, want string) {
		t.Helper()
		_, err := f.submit(ev)
		var rej *ingest.Rejection
		require.ErrorAs(t, err, &rej)
		require.Contains(t, rej.Error(), want)
	}
	tags := func(ch string) nostr.Tags { return nostr.Tags{{"d", uuid.NewString()}, {"h", ch}} }
	refused(f, f.sign(owner, workflow.KindDefinition, def(`cron: '*/2 * * * * *'`), tags(ch)),
		"invalid: workflow YAML parse error: invalid definition: trigger.cron: fires every 2s")
	f.save(owner, ch, uuid.NewString(), def(`cron: '* * * * *'`))

	fast := newFixtureWith(t, ingest.Options{}, workflow.Triggers{MinScheduleInterval: 2 * time.Second})
	owner = fast.key()
	ch = fast.channel(owner)
	fast.save(owner, ch, uuid.NewString(), def(`cron: '*/2 * * * * *'`))
	refused(fast, fast.sign(owner, workflow.KindDefinition, def(`cron: '* * * * * *'`), tags(ch)),
		"trigger.cron: fires every 1s; a schedule fires at most once every 2s")
}
