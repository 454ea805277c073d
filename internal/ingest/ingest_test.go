package ingest_test

import (
	"context"
	"fmt"

	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

type recorder struct {
	mu   sync.Mutex
	msgs [][]byte
}

func (r *recorder) Enqueue(msg []byte) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, msg)
	return true
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

// watchedPipeline is a pipeline into a new community at host, with one
// subscriber to all of that community's events, rec, and a key to sign
// with.
func watchedPipeline(t *testing.T, host string) (*pgxpool.Pool, community.Tenant, *ingest.Pipeline, *recorder, *nostr.SecretKey) {
	t.Helper()
	pool := dbtest.Pool(t)
	row, err := db.New(pool).CommunityCreate(t.Context(), host)
	require.NoError(t, err)
	tenant := community.FromRow(row)
	hub := fanout.NewHub()
	rec := &recorder{}
	hub.Subscribe(tenant.ID(), &fanout.Subscription{Receiver: rec, ID: "all", Filters: nostr.Filters{{}}})
	p := ingest.New(pool, hub, ingest.Options{MaxFutureSkew: time.Minute})
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	return pool, tenant, p, rec, key
}

// TestConcurrentVersionsOfOneSlotKeepExactlyTheNewest races many versions
// of one replaceable slot (and one addressable slot) through the pipeline in
// parallel. Exactly one row per slot must survive, the newest (ties to the
// lowest id). Each version is its own transaction on its own connection
// (grouping off, a connection per writer), as versions sent through
// several relay processes are: through one group writer they were written
// one group at a time, so the trigger's lock was never raced and the test
// passed without it. Mutation killed: without the trigger's
// pg_advisory_xact_lock, two transactions both see "no head", both insert,
// and two rows survive.
func TestConcurrentVersionsOfOneSlotKeepExactlyTheNewest(t *testing.T) {
	t.Parallel()
	const rounds, writers = 8, 12
	ctx := context.Background()
	pool := dbtest.PoolOn(t, dbtest.URL(t), writers)
	row, err := db.New(pool).CommunityCreate(ctx, "race.example")
	require.NoError(t, err)
	tenant := community.FromRow(row)
	hub := fanout.NewHub()
	p := ingest.New(pool, hub, ingest.Options{MaxFutureSkew: time.Minute, GroupMax: 1})
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)

	base := time.Now().Unix() - 1000
	for round := 0; round < rounds; round++ {
		for _, kind := range []int{10000 + round, 30000 + round} {
			events := make([]*nostr.Event, writers)
			for i := range events {
				// Pairs share created_at so the lowest-id tie rule is raced too.
				events[i] = &nostr.Event{Kind: kind, CreatedAt: base + int64(i/2), Content: fmt.Sprint(i), Tags: nostr.Tags{{"d", "slot"}}}
				require.NoError(t, events[i].Sign(key))
			}
			var wg sync.WaitGroup
			start := make(chan struct{})
			errs := make(chan error, writers)
			for _, ev := range events {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					_, err := p.Submit(ctx, tenant, ev.PubKey, ev)
					errs <- err
				}()
			}
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			want := events[writers-1]
			if other := events[writers-2]; other.ID < want.ID {
				want = other
			}
			var stored []string
			rows, err := pool.Query(ctx, `SELECT encode(id, 'hex') FROM events WHERE community_id = $1 AND kind = $2`, tenant.ID(), kind)
			require.NoError(t, err)
			for rows.Next() {
				var id string
				require.NoError(t, rows.Scan(&id))
				stored = append(stored, id)
			}
			require.NoError(t, rows.Err())
			require.Equal(t, []string{want.ID}, stored, "round %d kind %d", round, kind)
		}
	}
}

// A duplicate submitted concurrently is stored once and fanned out once.
func TestConcurrentDuplicatesAreStoredAndFannedOutOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, tenant, p, rec, key := watchedPipeline(t, "dup.example")
	ev := &nostr.Event{Kind: 1, CreatedAt: time.Now().Unix(), Content: "once", Tags: nostr.Tags{}}
	require.NoError(t, ev.Sign(key))

	outcomes := make(chan ingest.Outcome, 10)
	var wg sync.WaitGroup
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, err := p.Submit(ctx, tenant, ev.PubKey, ev)
			require.NoError(t, err)
			outcomes <- o
		}()
	}
	wg.Wait()
	close(outcomes)
	stored := 0
	for o := range outcomes {
		if o == ingest.Stored {
			stored++
		} else {
			require.Equal(t, ingest.Duplicate, o)
		}
	}
	require.Equal(t, 1, stored)
	require.Equal(t, 1, rec.count())
}

// A transaction that fails after the insert leaves no row and no fan-out.
func TestRollbackHasNoSideEffects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, tenant, p, rec, key := watchedPipeline(t, "rollback.example")

	// Break the deletion handler's side-row statement for this database only.
	_, err := pool.Exec(ctx, `
		CREATE FUNCTION refuse_update() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'side rows refused'; END $$;
		CREATE TRIGGER refuse_update BEFORE UPDATE ON events FOR EACH ROW EXECUTE FUNCTION refuse_update();`)
	require.NoError(t, err)
	target := &nostr.Event{Kind: 1, CreatedAt: time.Now().Unix() - 5, Content: "target", Tags: nostr.Tags{}}
	require.NoError(t, target.Sign(key))
	_, err = p.Submit(ctx, tenant, target.PubKey, target)
	require.NoError(t, err)
	before := rec.count()

	del := &nostr.Event{Kind: nostr.KindDeletion, CreatedAt: time.Now().Unix(), Tags: nostr.Tags{{"e", target.ID}}}
	require.NoError(t, del.Sign(key))
	_, err = p.Submit(ctx, tenant, del.PubKey, del)
	require.ErrorContains(t, err, "side rows refused")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE kind = 5`).Scan(&n))
	require.Zero(t, n, "the deletion row must roll back with its side rows")
	require.Equal(t, before, rec.count(), "nothing is fanned out for a rolled-back event")
}

// AfterCommit callbacks run only once the transaction committed: a side row
// that fails after scheduling one leaves it unrun.
func TestAfterCommitRunsOnlyOnCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	row, err := db.New(pool).CommunityCreate(ctx, "aftercommit.example")
	require.NoError(t, err)
	tenant := community.FromRow(row)
	p := ingest.New(pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: time.Minute})
	var ran []string
	p.RegisterSideRows(ingest.SideRows{
		Needs: func(ev *nostr.Event) bool { return ev.Kind == 1 },
		Apply: func(ctx context.Context, w *ingest.Write) error {
			w.AfterCommit(func() { ran = append(ran, w.Event.Content) })
			if w.Event.Content == "fail" {
				return fmt.Errorf("side row failed")
			}
			return nil
		},
	})
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	for _, content := range []string{"ok", "fail"} {
		ev := &nostr.Event{Kind: 1, CreatedAt: time.Now().Unix(), Content: content, Tags: nostr.Tags{}}
		require.NoError(t, ev.Sign(key))
		_, err := p.Submit(ctx, tenant, ev.PubKey, ev)
		if content == "fail" {
			require.Error(t, err)
		} else {
			require.NoError(t, err)
		}
	}
	require.Equal(t, []string{"ok"}, ran)
}

// OnPublish (which tells the read routing of a removal, docs/replica.md)
// runs before any local subscriber is sent the event: a subscriber that
// receives a deletion live and reads the history again at once finds the
// router told already, not a lagging standby serving the message back.
// Mutation killed: OnPublish after the local fan-out (the subscriber holds
// the deletion when OnPublish runs).
func TestOnPublishRunsBeforeTheLocalFanout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, tenant, p, rec, key := watchedPipeline(t, "publish-order.example")
	sentBefore := map[int]int{}
	p.OnPublish = func(_ uuid.UUID, ev *nostr.Event, _ *uuid.UUID, _ int64) { sentBefore[ev.Kind] = rec.count() }
	note := &nostr.Event{Kind: 1, CreatedAt: time.Now().Unix(), Content: "regretted", Tags: nostr.Tags{}}
	require.NoError(t, note.Sign(key))
	deletion := &nostr.Event{Kind: nostr.KindDeletion, CreatedAt: time.Now().Unix(), Tags: nostr.Tags{{"e", note.ID}}}
	require.NoError(t, deletion.Sign(key))
	for _, ev := range []*nostr.Event{note, deletion} {
		o, err := p.Submit(ctx, tenant, ev.PubKey, ev)
		require.NoError(t, err)
		require.Equal(t, ingest.Stored, o)
	}
	require.Equal(t, map[int]int{1: 0, nostr.KindDeletion: 1}, sentBefore, "subscriber messages when OnPublish ran")
	require.Equal(t, 2, rec.count())
}
