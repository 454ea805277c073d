package ingest_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// commitLosingPipeline is a pipeline on the fixture's database whose
// connections lose the answer of the cutAt-th COMMIT from when it is set.
func (f *fixture) commitLosingPipeline(cutAt *atomic.Int32, opts ingest.Options) *ingest.Pipeline {
	f.t.Helper()
	pool := dbtest.PoolOn(f.t, f.pool.Config().ConnString(), 0, dbtest.LoseCommitAnswer(cutAt))
	opts.MaxFutureSkew = time.Minute
	return ingest.New(pool, fanout.NewHub(), opts)
}

// A stored event sent again is a duplicate even when its checks would now
// refuse it because its own write changed what they see: a leave is
// stored, its member is gone, and "not a member of this channel" would
// tell a client whose COMMIT answer was lost (or whose relay died before
// its OK) that the leave failed, on every re-send.
// Mutation killed: finish answering a refusal without asking whether the
// event is stored (both the lost-commit answer and the re-send are refused).
func TestStoredLeaveIsADuplicateNotARefusal(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "commit-lost-leave.example", 0)
	owner, member := f.key(), f.key()
	ch := f.channel(owner, false)
	f.store(f.sign(member, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0))

	var cutAt atomic.Int32
	lossy := f.commitLosingPipeline(&cutAt, ingest.Options{})
	leave := f.sign(member, ingest.KindLeaveRequest, "", nostr.Tags{{"h", ch}}, 0)
	cutAt.Store(1)
	out, err := lossy.Submit(f.ctx, f.tenant, leave.PubKey, leave)
	require.Zero(t, cutAt.Load(), "the leave's COMMIT went through the losing connection")
	require.Equal(t, 1, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1`, leave.ID), "the leave committed")
	require.NoError(t, err, "a committed leave is not answered as refused")
	require.Equal(t, ingest.Duplicate, out)

	out, err = f.submit(leave)
	require.NoError(t, err, "a stored leave sent again is not refused")
	require.Equal(t, ingest.Duplicate, out)

	// Another member's leave, never stored, is still refused.
	stranger := f.key()
	f.rejected(f.sign(stranger, ingest.KindLeaveRequest, "", nostr.Tags{{"h", ch}}, 0), "invalid: not a member of this channel")
}

// One event of a group cannot turn a group mate's stored event into a
// refusal: a member's message and the owner's removal of that member
// commit together, the COMMIT's answer is lost, and every event is run
// again alone, the message after the removal it committed with. The
// message is stored; its author hears duplicate, not "restricted".
// Mutation killed: as above (the message is answered restricted).
func TestGroupMateDoesNotTurnAStoredMessageIntoARefusal(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "commit-lost-group.example", 0)
	owner, member := f.key(), f.key()
	ch := f.channel(owner, true)
	f.store(f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex(), "member"}}, 0))

	var cutAt atomic.Int32
	f.p = f.commitLosingPipeline(&cutAt, ingest.Options{GroupWriters: 1})
	msg := f.sign(member, ingest.KindChat, "hello", nostr.Tags{{"h", ch}}, 0)
	remove := f.sign(owner, ingest.KindRemoveUser, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}}, 0)
	g := f.holdWriter()
	results := f.submitTogether([]*nostr.Event{msg})
	waitQueued(t, f.p, 1)
	results = append(results, f.submitTogether([]*nostr.Event{remove})...)
	waitQueued(t, f.p, 2)
	cutAt.Store(2) // the gate's group commits; the next group's answer is lost
	g.open(t)
	msgResult, removeResult := <-results[0], <-results[1]
	require.Zero(t, cutAt.Load(), "the group's COMMIT went through the losing connection")
	require.Equal(t, 1, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1`, msg.ID), "the message committed")
	require.NoError(t, msgResult.err, "a stored message is not answered as refused")
	require.Equal(t, ingest.Duplicate, msgResult.outcome)
	require.NoError(t, removeResult.err)
}
