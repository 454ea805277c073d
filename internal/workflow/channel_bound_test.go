package workflow_test

import (
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
)

const boundedYAML = "name: W\ntrigger: {on: message_posted}\nsteps: [{id: a, action: send_message, text: hi}]"

// Every message in a channel evaluates each of its firing workflows inside
// the message's transaction, and any member may save workflows: the
// per-channel bound holds when members save at once, each save in its own
// transaction (no group commit), so that no two saves count the same
// snapshot. Mutation killed: no channel lock before the count (more than
// the bound are stored).
func TestWorkflowsPerChannelBoundUnderParallelSaves(t *testing.T) {
	t.Parallel()
	const bound, savers = 3, 12
	f := newFixtureWith(t, ingest.Options{GroupMax: 1}, workflow.Triggers{MaxPerChannel: bound})
	owner := f.key()
	members := make([]*nostr.SecretKey, savers)
	for i := range members {
		members[i] = f.key()
	}
	ch := f.channel(owner, members...)

	events := make([]*nostr.Event, savers)
	for i, m := range members {
		events[i] = f.sign(m, workflow.KindDefinition, boundedYAML, nostr.Tags{{"d", uuid.NewString()}, {"h", ch}})
	}
	start := make(chan struct{})
	errs := make(chan error, savers)
	var wg sync.WaitGroup
	for _, ev := range events {
		wg.Go(func() {
			<-start
			_, err := f.submit(ev)
			errs <- err
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	stored := 0
	for err := range errs {
		if err == nil {
			stored++
			continue
		}
		var rej *ingest.Rejection
		require.True(t, errors.As(err, &rej), "a save over the bound is refused, not failed: %v", err)
		require.Equal(t, "restricted: the channel has its limit of 3 active workflows; archive one first", rej.Error())
	}
	require.Equal(t, bound, stored)
	require.Equal(t, bound, f.count(`SELECT count(*) FROM workflows WHERE channel_id = $1 AND status = 'active' AND enabled`, ch))
}

// At the bound, a re-save of a workflow that fires adds nothing and is
// accepted; archiving one makes room; a workflow its owner's removal
// disabled counts again when a re-save enables it. Mutation killed: every
// existing row taken as already firing (the re-enabling save is accepted
// over the bound).
func TestWorkflowsPerChannelBoundCountsWhatASaveEnables(t *testing.T) {
	t.Parallel()
	const bound = 2
	f := newFixtureWith(t, ingest.Options{}, workflow.Triggers{MaxPerChannel: bound})
	owner, a, b, c := f.key(), f.key(), f.key(), f.key()
	ch := f.channel(owner, a, b, c)
	full := "restricted: the channel has its limit of 2 active workflows; archive one first"

	first, second := uuid.NewString(), uuid.NewString()
	f.save(a, ch, first, boundedYAML)
	f.save(b, ch, second, boundedYAML)
	f.rejected(f.sign(c, workflow.KindDefinition, boundedYAML, nostr.Tags{{"d", uuid.NewString()}, {"h", ch}}), full)
	f.clock.Advance(time.Second) // a re-save replaces the definition: a newer created_at
	f.save(a, ch, first, boundedYAML+"\ndescription: edited")

	// b leaves (their workflow is disabled) and c takes the room.
	f.store(f.sign(b, ingest.KindLeaveRequest, "", nostr.Tags{{"h", ch}}))
	f.save(c, ch, uuid.NewString(), boundedYAML)
	// b joins again: re-saving would make a third workflow fire.
	f.store(f.sign(b, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}))
	f.rejected(f.sign(b, workflow.KindDefinition, boundedYAML, nostr.Tags{{"d", second}, {"h", ch}}), full)

	// Archiving one by its coordinate makes room again.
	f.store(f.sign(a, nostr.KindDeletion, "", nostr.Tags{{"a", "30620:" + pubHex(a) + ":" + first}}))
	f.save(b, ch, second, boundedYAML)
	require.Equal(t, bound, f.count(`SELECT count(*) FROM workflows WHERE channel_id = $1 AND status = 'active' AND enabled`, ch))
}

// An event's trigger filters share one evaluation's limits, split evenly:
// a filter that builds 840,000 bytes of text fires while it is the
// channel's only workflow, and not once a second workflow shares the
// event's limits (the second still fires). Mutation killed: createRuns
// without the share (the filter fires both times).
func TestTriggerFiltersShareOneEvaluationsLimits(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, member := f.key(), f.key()
	ch := f.channel(owner, member)
	costly, plain := uuid.NewString(), uuid.NewString()
	text := strings.Repeat("x", 60_000) // doubled three times: 120 + 240 + 480 KB built
	f.save(member, ch, costly, "name: C\ntrigger: {on: message_posted, filter: '"+doublingFilter(3)+"'}\n"+
		"steps: [{id: a, action: send_message, text: fired}]")
	// Alone, the filter is within one evaluation's limits.
	f.store(f.sign(member, ingest.KindChat, text, nostr.Tags{{"h", ch}}))
	require.Len(t, f.runIDs(costly), 1, "alone, the filter is within one evaluation's limits")

	f.save(owner, ch, plain, boundedYAML)
	f.store(f.sign(member, ingest.KindChat, text+"!", nostr.Tags{{"h", ch}}))
	require.Len(t, f.runIDs(costly), 1, "with two workflows, the filter gets half the limits and fails")
	require.Len(t, f.runIDs(plain), 1)
}

// Every message, reaction and diff in a channel reads the channel's firing
// workflows inside its write transaction, which the other events of its
// commit group share. Deciding whether one fires needs its trigger and
// enabled flag only, but the whole definition was read and decoded: 20
// workflows of 50 steps with long texts (any member may save them) made
// every message in the channel read and decode 4 MB (91 ms a message
// against 6 ms with short texts, measured on the 2-core box). Allocation,
// not time, is asserted: what a message decodes is the definitions' size.
//
// Not parallel, so that no other test allocates while it measures.
// Mutation killed: WorkflowsTriggerable selecting the whole definition
// again (decoded in createRuns) allocates some 4 MB a message.
func TestMessageReadsTriggersNotWholeDefinitions(t *testing.T) {
	f := newFixtureWith(t, ingest.Options{}, workflow.Triggers{})
	owner := f.key()
	ch := f.channel(owner)
	long := strings.Repeat("é", 1_200) // 50 steps of 2,400 bytes: 120 KB a definition
	for i := range workflow.DefaultMaxPerChannel {
		var yaml strings.Builder
		yaml.WriteString("name: F\ntrigger: {on: message_posted, filter: 'trigger_text == \"never\"'}\nsteps:\n")
		for s := range 50 {
			yaml.WriteString("- {id: s" + itoa(int64(s)) + ", action: send_message, text: '" + long + "'}\n")
		}
		f.save(owner, ch, uuid.NewString(), yaml.String())
		_ = i
	}
	require.Greater(t, f.count(`SELECT sum(octet_length(definition::text))::int FROM workflows`), 2_000_000)
	post := func(i int) {
		f.store(f.sign(owner, ingest.KindChat, "m"+itoa(int64(i)), nostr.Tags{{"h", ch}}))
	}
	post(0) // warm caches (compiled filters, prepared statements)
	const messages = 10
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 1; i <= messages; i++ {
		post(i)
	}
	runtime.ReadMemStats(&after)
	perMessage := (after.TotalAlloc - before.TotalAlloc) / messages
	t.Logf("%d bytes allocated per message", perMessage)
	require.Less(t, perMessage, uint64(500_000), "bytes allocated per message beside 2.4 MB of definitions")
	require.Zero(t, f.count(`SELECT count(*) FROM workflow_runs`), "no filter holds")
}
