package ingest_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// A removal (9001) and the member's own leave (9022) sent at once through
// two pipelines (two group writers, each in its own transaction): the
// channel's row lock orders them, so exactly one is stored and writes the
// removal and its 44101 notice, and the other is refused for a member who
// is no longer there. Rounds repeat the race with fresh members.
func TestConcurrentRemovalAndLeaveRemoveOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "removal-race.example", 16)
	a, b := f.foldProcess(1000, time.Second), f.foldProcess(1000, time.Second)
	f.p = a.p
	owner := f.key()
	ch := f.channel(owner, false)
	for round := range 20 {
		member := f.key()
		f.store(f.sign(member, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0))
		remove := f.sign(owner, ingest.KindRemoveUser, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}, {"round", fmt.Sprint(round)}}, 0)
		leave := f.sign(member, ingest.KindLeaveRequest, "", nostr.Tags{{"h", ch}, {"round", fmt.Sprint(round)}}, 0)
		var wg sync.WaitGroup
		outcomes := make([]error, 2)
		stored := make([]bool, 2)
		for i, pair := range []struct {
			p  *ingest.Pipeline
			ev *nostr.Event
		}{{a.p, remove}, {b.p, leave}} {
			wg.Go(func() {
				out, err := pair.p.Submit(f.ctx, f.tenant, pair.ev.PubKey, pair.ev)
				outcomes[i], stored[i] = err, err == nil && out == ingest.Stored
			})
		}
		wg.Wait()
		require.True(t, stored[0] != stored[1], "round %d: exactly one of the removal and the leave is stored: %v", round, outcomes)
		require.Equal(t, 1, f.count(`SELECT count(*) FROM events WHERE kind = $1 AND tag_index && ARRAY['p:' || $2]`, ingest.KindMemberRemoved, member.PublicKeyHex()),
			"round %d: one removal notice", round)
		require.Zero(t, f.count(`SELECT count(*) FROM channel_members WHERE pubkey = decode($1, 'hex') AND removed_at IS NULL`, member.PublicKeyHex()))
	}
}
