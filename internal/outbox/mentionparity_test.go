package outbox

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
)

// TestDeliveredMentionsAreExactlyTheMentionRows submits, through the ingest
// pipeline with listener delivery wired in as the relay wires it (same
// mention cap), a message whose p tags spell pubkeys in lower, upper and
// mixed case plus more lowercase ones than the cap, all registered by a
// listener: the pubkeys that get outbox rows are exactly those that get
// event_mentions rows. Mutations killed: outbox parsing p tags in either
// case while mention rows take lowercase only (an upper-case mention was
// delivered but had no mention row); outbox ignoring the cap.
func TestDeliveredMentionsAreExactlyTheMentionRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	lower, upper, mixed, second, third := newPubkey(t), newPubkey(t), newPubkey(t), newPubkey(t), newPubkey(t)
	f.register(newPubkey(t), lower, upper, mixed, second, third)

	const maxMentions = 2
	p := ingest.New(f.pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: time.Minute, MaxMentions: maxMentions})
	p.RegisterSideRows(ingest.SideRows{Needs: Mentions, Apply: func(ctx context.Context, w *ingest.Write) error {
		_, _, err := Enqueue(ctx, w.Q, nil, w.Tenant.ID(), w.ChannelID, w.Event, maxMentions, clock.Wall())
		return err
	}})
	row, err := f.q.CommunityByHost(ctx, testHost)
	require.NoError(t, err)
	ev := message(t, 40002, lower, strings.ToUpper(upper), strings.ToUpper(mixed[:32])+mixed[32:], second, third)
	_, err = p.Submit(ctx, community.FromRow(row), ev.PubKey, ev)
	require.NoError(t, err)

	pubkeys := func(sql string) []string {
		rows, err := f.pool.Query(ctx, sql)
		require.NoError(t, err)
		var out []string
		for rows.Next() {
			var pk string
			require.NoError(t, rows.Scan(&pk))
			out = append(out, pk)
		}
		require.NoError(t, rows.Err())
		sort.Strings(out)
		return out
	}
	delivered := pubkeys(`SELECT encode(target_pubkey, 'hex') FROM operator_listener_outbox`)
	mentioned := pubkeys(`SELECT pubkey_hex FROM event_mentions`)
	require.Equal(t, mentioned, delivered)
	want := []string{lower, second}
	sort.Strings(want)
	require.Equal(t, want, mentioned)
}
