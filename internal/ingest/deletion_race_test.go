package ingest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// An a-coordinate deletion racing a late, older version of the same address
// must never leave that version visible, whichever transaction reaches the
// slot first. Each case holds one event's transaction open at its end (a
// side row that waits), submits the other, waits until the other is blocked
// on the slot lock (or done), and only then lets the first commit: the
// interleaving that loses a version without the lock happens every run.
// The other event goes through a second pipeline, as from a second relay
// process: one pipeline writes an event that arrives while a group is being
// written after that group, not beside it.
//
// Mutation killed: without the deletion's EventSlotLock, in "deletion
// first" the version's trigger misses the uncommitted deletion, and in
// "version first" the deletion's UPDATE misses the uncommitted version;
// either way the old version stays live ("a deleted address came back").
func TestAddressDeletionRacingALateVersion(t *testing.T) {
	t.Parallel()
	for _, first := range []string{"deletion", "version"} {
		t.Run(first+" first", func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, "delrace.example", 4)
			key := f.key()
			now := time.Now().Unix()
			version := f.sign(key, 30023, "late version", nostr.Tags{{"d", "slot"}}, now-20)
			deletion := f.sign(key, nostr.KindDeletion, "", nostr.Tags{{"a", fmt.Sprintf("30023:%s:slot", key.PublicKeyHex())}}, now-10)
			held, other := deletion, version
			if first == "version" {
				held, other = version, deletion
			}

			require.NoError(t, commitAfterBlocked(t, f, held, other))

			var live int
			require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM events WHERE community_id = $1 AND kind = 30023 AND d_tag = 'slot' AND deleted_at IS NULL`,
				f.tenant.ID()).Scan(&live))
			require.Zero(t, live, "a deleted address came back")
		})
	}
}

// A deletion naming an event of its author that is still being written
// reads its targets before that event commits, then waits for it (on the
// author's deletion lock at its own insert, or on the slot lock for an a
// tag). It must then answer as if the target had been there all along:
// refused when the target is a channel's moderation event, and never
// stored community-global naming an event of a private channel. A group
// writer runs it again alone, where it sees the committed target and goes
// to its channel; written alone already, it is refused and its client
// sends it again.
//
// Mutations killed: applyDeletion without recheckTargetsUnderLock (the
// deletion of the moderation event is stored, its client told the removal
// was retracted while it stays applied; the deletion of the private note
// is stored community-global, telling every member which private id its
// author deleted); without the slot's re-read after EventSlotLock (the
// a-tag deletion is stored community-global, its coordinate naming the
// private d tag); retryAlone not knowing errDeletionTargetMoved (the grouped
// cases are refused instead of stored in the channel).
func TestDeletionRacingItsTargetAnswersAsIfTheTargetWasThere(t *testing.T) {
	t.Parallel()
	t.Run("moderation event", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, "delrace-moderation.example", 4)
		owner, member := f.key(), f.key()
		ch := f.channel(owner, true)
		putUser := f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}}, 0)
		deletion := f.sign(owner, nostr.KindDeletion, "", nostr.Tags{{"e", putUser.ID}}, 0)

		err := commitAfterBlocked(t, f, putUser, deletion)
		var rej *ingest.Rejection
		require.True(t, errors.As(err, &rej), "want the deletion refused, got %v", err)
		require.Equal(t, "restricted: "+ingest.DeletionOfModerationRefused, rej.Error())
		require.Zero(t, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1`, deletion.ID))
		require.Equal(t, 1, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1 AND deleted_at IS NULL`, putUser.ID))
	})
	for _, alone := range []bool{false, true} {
		for _, target := range []string{"note by id", "address"} {
			name := target
			if alone {
				name += " written alone"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				f := newFixture(t, "delrace-private.example", 4)
				if alone {
					f.secondGroupMax = 1
				}
				alice := f.key()
				ch := f.channel(alice, true)
				held := f.sign(alice, ingest.KindChat, "secret", nostr.Tags{{"h", ch}}, 0)
				tag := nostr.Tag{"e", held.ID}
				if target == "address" {
					held = f.sign(alice, 30023, "secret", nostr.Tags{{"d", "secret-slug"}, {"h", ch}}, 0)
					tag = nostr.Tag{"a", "30023:" + alice.PublicKeyHex() + ":secret-slug"}
				}
				deletion := f.sign(alice, nostr.KindDeletion, "", nostr.Tags{tag}, 0)

				err := commitAfterBlocked(t, f, held, deletion)
				if alone {
					var rej *ingest.Rejection
					require.True(t, errors.As(err, &rej), "want the deletion refused, got %v", err)
					require.Contains(t, rej.Error(), "invalid: an event this deletion names was stored in another channel while the deletion was being written")
					require.Zero(t, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1`, deletion.ID))
					f.store(deletion) // sent again, it goes where its target is
				} else {
					require.NoError(t, err)
				}
				require.NotNil(t, f.eventChannel(deletion.ID), "the deletion is not community-global")
				require.Equal(t, ch, f.eventChannel(deletion.ID).String())
				require.Zero(t, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1 AND deleted_at IS NULL`, held.ID))
			})
		}
	}
}

// commitAfterBlocked submits held on f's pipeline and holds its
// transaction open at its end (a side row that waits), submits other
// through a second pipeline, as from a second relay process, waits until
// other is blocked on a lock (or done), and only then lets held commit.
// held must succeed; other's error is returned.
func commitAfterBlocked(t *testing.T, f *fixture, held, other *nostr.Event) error {
	t.Helper()
	reached, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	// A failing test must not leave the held transaction open.
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	f.p.RegisterSideRows(ingest.SideRows{
		Needs: func(ev *nostr.Event) bool { return ev.ID == held.ID },
		Apply: func(ctx context.Context, _ *ingest.Write) error {
			close(reached)
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	})
	secondProcess := ingest.New(f.pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: time.Minute, GroupMax: f.secondGroupMax})
	submit := func(p *ingest.Pipeline, ev *nostr.Event) chan error {
		done := make(chan error, 1)
		go func() {
			_, err := p.Submit(f.ctx, f.tenant, ev.PubKey, ev)
			done <- err
		}()
		return done
	}

	heldDone := submit(f.p, held)
	select {
	case <-reached: // everything but COMMIT has run
	case err := <-heldDone:
		t.Fatalf("the held event finished before its side row: %v", err)
	}
	otherDone := submit(secondProcess, other)
	waitBlockedOrDone(t, f.pool, otherDone)
	releaseOnce.Do(func() { close(release) })
	require.NoError(t, <-heldDone)
	return <-otherDone
}

// waitBlockedOrDone returns once a session of pool's database waits for a
// lock, or once done has a result (which it puts back).
func waitBlockedOrDone(t *testing.T, pool *pgxpool.Pool, done chan error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			done <- err
			return
		default:
		}
		var waiting int
		require.NoError(t, pool.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE NOT l.granted AND a.datname = current_database()`).Scan(&waiting))
		if waiting > 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the second event neither finished nor waited for a lock")
}
