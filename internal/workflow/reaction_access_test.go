package workflow_test

import (
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// An add_reaction step acts on its owner's authority, as a send_message
// does: the owner must still read the channel when the reaction is stored.
// The step read its workflow (enabled) before the owner's removal from a
// private channel committed, and the removal's trigger disables the
// workflow only in that uncommitted transaction; the reaction then waited
// for the channel's write lock, which the removal holds, and was stored
// after it, checked as the relay (which may always read) and never as the
// owner. Now the owner's access is read under that lock, after the
// removal, and the run fails with owner_unauthorized.
//
// Mutation killed: addReaction without ownerChannelAccess (the run
// completes and the relay's reaction is stored after the removal).
func TestAReactionStepRacingItsOwnersRemovalIsRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	admin, owner := f.key(), f.key()
	ch := f.privateChannel(admin, owner)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: R\ntrigger: {on: message_posted}\nsteps: [{id: eyes, action: add_reaction, emoji: '👀'}]")
	f.store(f.sign(owner, ingest.KindChat, "look", nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]
	e := f.engine(time.Minute)
	claims, err := e.ClaimDue(f.ctx, 10)
	require.NoError(t, err)
	require.Len(t, claims, 1)

	// The removal, as a membership change makes it: the channel's write
	// lock exclusive, then the member row (whose trigger disables the
	// owner's workflows there), held open while the step runs.
	removal, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer removal.Rollback(f.ctx) //nolint:errcheck // committed below
	_, err = removal.Exec(f.ctx, `SELECT pg_advisory_xact_lock(channels_write_lock_key($1, $2))`, f.tenant.ID(), uuid.MustParse(ch))
	require.NoError(t, err)
	pub := owner.PublicKey()
	n, err := removal.Exec(f.ctx, `UPDATE channel_members SET removed_at = now() WHERE community_id = $1 AND channel_id = $2 AND pubkey = $3`,
		f.tenant.ID(), uuid.MustParse(ch), pub[:])
	require.NoError(t, err)
	require.EqualValues(t, 1, n.RowsAffected())

	var wg sync.WaitGroup
	wg.Go(func() { e.Execute(f.ctx, claims[0]) })
	// The step waits for the write lock, past its read of the workflow.
	require.Eventually(t, func() bool {
		return f.count(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`) > 0
	}, 30*time.Second, 5*time.Millisecond)
	require.NoError(t, removal.Commit(f.ctx))
	wg.Wait()

	r := f.run(run)
	require.Equal(t, "failed", string(r.Status))
	require.Equal(t, string(workflow.CodeOwnerUnauthorized), *r.ErrorCode)
	require.Zero(t, f.count(`SELECT count(*) FROM events WHERE kind = 7 AND channel_id = $1`, uuid.MustParse(ch)), "no reaction stored")
}
