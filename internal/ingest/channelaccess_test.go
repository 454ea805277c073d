package ingest_test

import (
	"encoding/hex"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// A channel check that waits for a removal of its pubkey in progress
// (holding the channel's row, as every membership change does) answers
// with the state that removal committed: no role, and the readers version
// it wrote. Otherwise a write checked under a removal in flight was stored
// after it as the removed member's, and fanned out from a reader set older
// than its commit.
// Mutations killed: ChannelAccess without its row lock (the check does not
// wait, and answers while the removal is still uncommitted: this test's
// "does not wait" assertion); ChannelAccess not reading again after its
// lock waited (the role read before the removal committed comes back).
func TestChannelAccessWaitingForARemovalSeesIt(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "access.example", 4)
	owner, member := f.key(), f.key()
	ch := f.channel(owner, true)
	f.store(f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}}, 0))
	channel := uuid.MustParse(ch)
	memberBytes, _ := hex.DecodeString(member.PublicKeyHex())
	params := db.ChannelAccessParams{CommunityID: f.tenant.ID(), ID: channel, Pubkey: memberBytes}
	before, err := ingest.ChannelAccess(f.ctx, db.New(f.pool), params)
	require.NoError(t, err)
	require.NotNil(t, before.MemberRole)

	removal, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = removal.Rollback(f.ctx) }()
	rq := db.New(removal)
	_, err = rq.ChannelLockForUpdate(f.ctx, db.ChannelLockForUpdateParams{CommunityID: f.tenant.ID(), ID: channel})
	require.NoError(t, err)
	removed, err := rq.ChannelMemberRemove(f.ctx, db.ChannelMemberRemoveParams{CommunityID: f.tenant.ID(), ChannelID: channel, Pubkey: memberBytes, RemovedBy: memberBytes})
	require.NoError(t, err)
	require.EqualValues(t, 1, removed)

	write, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = write.Rollback(f.ctx) }()
	type answer struct {
		row db.ChannelAccessRow
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		row, err := ingest.ChannelAccess(f.ctx, db.New(write), params)
		answered <- answer{row, err}
	}()
	require.Eventually(t, func() bool {
		return f.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) == 1
	}, 30*time.Second, 5*time.Millisecond, "the check does not wait for the removal in progress")
	require.NoError(t, removal.Commit(f.ctx))
	got := <-answered
	require.NoError(t, got.err)
	require.Nil(t, got.row.MemberRole, "the check answered with the role the removal took away")
	require.Greater(t, got.row.ReadersVersion, before.ReadersVersion)
}
