package ingest_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

type threadRow struct {
	depth, replies, descendants int
	parent, root                string
	lastReplyAt                 *time.Time
}

func (f *fixture) thread(id string) (threadRow, bool) {
	f.t.Helper()
	var r threadRow
	rows, err := f.pool.Query(f.ctx, `
		SELECT depth, reply_count, descendant_count, coalesce(encode(parent_event_id, 'hex'), ''),
		       coalesce(encode(root_event_id, 'hex'), ''), last_reply_at
		FROM thread_metadata WHERE community_id = $1 AND encode(event_id, 'hex') = $2`, f.tenant.ID(), id)
	require.NoError(f.t, err)
	defer rows.Close()
	if !rows.Next() {
		require.NoError(f.t, rows.Err())
		return r, false
	}
	require.NoError(f.t, rows.Scan(&r.depth, &r.replies, &r.descendants, &r.parent, &r.root, &r.lastReplyAt))
	return r, true
}

// submitAll submits events in parallel goroutines released together and
// requires every one to be stored.
func (f *fixture) submitAll(events []*nostr.Event) {
	f.t.Helper()
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, len(events))
	for _, ev := range events {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := f.submit(ev)
			errs <- err
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(f.t, err)
	}
}

// TestConcurrentThreadRepliesKeepExactCounts races replies of every NIP-10
// form (reply marker, root marker, positional) at several depths of two
// threads through real parallel Submits on a 24-connection pool, each
// reply in its own transaction (grouping off, as replies sent through
// several relay processes are), then checks every counter exactly. Through
// one group writer the replies were written one group at a time, one
// transaction after the other, and the first mutation below survived.
//
// Mutations checked by temporarily changing the code:
//   - killed: "reply_count = reply_count + 1" (and descendant_count) turned
//     into read-then-write, "(SELECT reply_count ... same row) + 1", with the
//     ThreadRootLock call removed: lost updates (20 replies counted as 12);
//   - killed: last_reply_at set to the reply's created_at instead of
//     greatest(existing, created_at): an older reply committing last lowers it;
//   - survives, as it should: the same read-then-write with the root lock
//     kept (the lock serializes the thread's writers, so the read is fresh);
//   - survives: the root lock removed with relative increments kept (row
//     level UPDATE increments are exact on their own; the lock is what makes
//     any read-modify-write in a thread safe and fixes the lock order).
func TestConcurrentThreadRepliesKeepExactCounts(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "threads.example", 24)
	f.p = ingest.New(f.pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: time.Minute, GroupMax: 1})
	alice, bob := f.key(), f.key()
	ch := f.channel(alice, false)
	h := nostr.Tag{"h", ch}
	top := f.store(f.sign(alice, 9, "top", nostr.Tags{h}, f.base))
	other := f.store(f.sign(bob, 9, "other thread", nostr.Tags{h}, f.base+1))
	_, ok := f.thread(top.ID)
	require.False(t, ok, "a message nobody answered has no thread row")

	// Created_at values are shuffled so a later-committing reply may be older.
	at := func(i int) int64 { return f.base + 100 + int64((i*37)%200) }
	reply := func(key *nostr.SecretKey, parent *nostr.Event, i int, tags ...nostr.Tag) *nostr.Event {
		return f.sign(key, 9, fmt.Sprint("reply ", i), append(nostr.Tags{h}, tags...), at(i))
	}

	// Phase 1: 20 concurrent direct replies to one parent (its depth-0 row is
	// created by whichever commits first).
	var direct []*nostr.Event
	for i := 0; i < 20; i++ {
		direct = append(direct, reply([]*nostr.SecretKey{alice, bob}[i%2], top, i, nostr.Tag{"e", top.ID, "", "reply"}))
	}
	f.submitAll(direct)
	row, _ := f.thread(top.ID)
	require.Equal(t, threadRow{depth: 0, replies: 20, descendants: 20, lastReplyAt: row.lastReplyAt}, row)

	// Phase 2: nested replies to two of them, root-marker replies to the top,
	// positional replies, and a second thread, all at once.
	r0, r1 := direct[0], direct[1]
	var batch []*nostr.Event
	for i := 20; i < 30; i++ { // depth 2 under r0: reply + root markers
		batch = append(batch, reply(alice, r0, i, nostr.Tag{"e", top.ID, "", "root"}, nostr.Tag{"e", r0.ID, "", "reply"}))
	}
	for i := 30; i < 35; i++ { // direct replies to the top via the root marker alone
		batch = append(batch, reply(bob, top, i, nostr.Tag{"e", top.ID, "", "root"}))
	}
	for i := 35; i < 40; i++ { // depth 2 under r1, deprecated positional form
		batch = append(batch, reply(bob, r1, i, nostr.Tag{"e", top.ID}, nostr.Tag{"e", r1.ID}))
	}
	for i := 40; i < 50; i++ { // the other thread
		batch = append(batch, reply(alice, other, i, nostr.Tag{"e", other.ID, "", "reply"}))
	}
	f.submitAll(batch)

	// Phase 3: depth 3 under one depth-2 reply, racing more direct replies.
	d := batch[0]
	var deep []*nostr.Event
	for i := 50; i < 58; i++ {
		deep = append(deep, reply(bob, d, i, nostr.Tag{"e", top.ID, "", "root"}, nostr.Tag{"e", d.ID, "", "reply"}))
	}
	for i := 58; i < 66; i++ {
		deep = append(deep, reply(alice, top, i, nostr.Tag{"e", top.ID}))
	}
	f.submitAll(deep)

	maxAt := func(evs ...[]*nostr.Event) *time.Time {
		var m int64
		for _, list := range evs {
			for _, ev := range list {
				m = max(m, ev.CreatedAt)
			}
		}
		tm := time.Unix(m, 0)
		return &tm
	}
	requireRow := func(ev *nostr.Event, want threadRow) {
		t.Helper()
		got, ok := f.thread(ev.ID)
		require.True(t, ok, "no thread row for %s", ev.Content)
		if want.lastReplyAt != nil {
			require.NotNil(t, got.lastReplyAt, ev.Content)
			require.True(t, want.lastReplyAt.Equal(*got.lastReplyAt), "%s: last_reply_at %v, want %v", ev.Content, got.lastReplyAt, want.lastReplyAt)
		} else {
			require.Nil(t, got.lastReplyAt, ev.Content)
		}
		got.lastReplyAt, want.lastReplyAt = nil, nil
		require.Equal(t, want, got, ev.Content)
	}
	underR0, underR1, rootMarked, underD, lateDirect := batch[0:10], batch[15:20], batch[10:15], deep[0:8], deep[8:16]
	requireRow(top, threadRow{depth: 0, replies: 20 + 5 + 8, descendants: 20 + 10 + 5 + 5 + 8 + 8,
		lastReplyAt: maxAt(direct, underR0, underR1, rootMarked, underD, lateDirect)})
	requireRow(r0, threadRow{depth: 1, replies: 10, descendants: 18, parent: top.ID, root: top.ID, lastReplyAt: maxAt(underR0, underD)})
	requireRow(r1, threadRow{depth: 1, replies: 5, descendants: 5, parent: top.ID, root: top.ID, lastReplyAt: maxAt(underR1)})
	requireRow(d, threadRow{depth: 2, replies: 8, descendants: 8, parent: r0.ID, root: top.ID, lastReplyAt: maxAt(underD)})
	for _, ev := range underD {
		requireRow(ev, threadRow{depth: 3, parent: d.ID, root: top.ID})
	}
	for _, ev := range underR1 {
		requireRow(ev, threadRow{depth: 2, parent: r1.ID, root: top.ID})
	}
	for _, ev := range append(rootMarked, lateDirect...) {
		requireRow(ev, threadRow{depth: 1, parent: top.ID, root: top.ID})
	}
	requireRow(other, threadRow{depth: 0, replies: 10, descendants: 10, lastReplyAt: maxAt(batch[20:30])})
	require.Equal(t, 2+20+30+16, f.count(`SELECT count(*) FROM thread_metadata WHERE community_id = $1`, f.tenant.ID()))
}

// A reply must name a live event of the same community and channel.
func TestThreadReplyParentMustExistInTheSameChannel(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "parents.example", 0)
	alice := f.key()
	ch, elsewhere := f.channel(alice, false), f.channel(alice, false)
	msg := f.store(f.sign(alice, 9, "here", nostr.Tags{{"h", ch}}, f.base))
	away := f.store(f.sign(alice, 9, "there", nostr.Tags{{"h", elsewhere}}, f.base))
	note := f.store(f.sign(alice, 1, "global note", nil, f.base))
	gone := f.store(f.sign(alice, 9, "soon deleted", nostr.Tags{{"h", ch}}, f.base))
	f.store(f.sign(alice, 5, "", nostr.Tags{{"e", gone.ID}}, f.base+1))
	unknown := fmt.Sprintf("%064x", 42)

	const notFound = "invalid: reply parent not found"
	replyTo := func(tags ...nostr.Tag) *nostr.Event {
		return f.sign(alice, 9, "reply", append(nostr.Tags{{"h", ch}}, tags...), 0)
	}
	f.rejected(replyTo(nostr.Tag{"e", unknown, "", "reply"}), notFound)
	f.rejected(replyTo(nostr.Tag{"e", away.ID, "", "reply"}), notFound)
	f.rejected(replyTo(nostr.Tag{"e", note.ID}), notFound)
	f.rejected(replyTo(nostr.Tag{"e", gone.ID, "", "root"}), notFound)
	f.rejected(replyTo(nostr.Tag{"e", "not-an-id", "", "reply"}), notFound)
	// The reply marker wins over a valid root marker.
	f.rejected(replyTo(nostr.Tag{"e", msg.ID, "", "root"}, nostr.Tag{"e", unknown, "", "reply"}), notFound)

	// Another community holding the same channel id cannot see the parent.
	otherTenant := f.community("parents-other.example")
	bob := f.key()
	create := f.sign(bob, 9007, "", nostr.Tags{{"h", ch}, {"name", "same id"}}, 0)
	_, err := f.p.Submit(f.ctx, otherTenant, create.PubKey, create)
	require.NoError(t, err)
	cross := f.sign(bob, 9, "cross", nostr.Tags{{"h", ch}, {"e", msg.ID, "", "reply"}}, 0)
	_, err = f.p.Submit(f.ctx, otherTenant, cross.PubKey, cross)
	require.EqualError(t, err, notFound)

	require.Zero(t, f.count(`SELECT count(*) FROM thread_metadata`), "rejected replies leave no thread rows")

	// A mention is not a reply; a valid reply still works afterwards.
	f.store(replyTo(nostr.Tag{"e", unknown, "", "mention"}))
	ok := f.store(replyTo(nostr.Tag{"e", msg.ID, "", "reply"}))
	row, _ := f.thread(ok.ID)
	require.Equal(t, msg.ID, row.parent)
	require.Equal(t, 2, f.count(`SELECT count(*) FROM thread_metadata`))
}

// A reply to a p-gated event of the channel (a gift wrap) is answered as a
// reaction to it is: "reply parent not found" to a member it is not
// addressed to, so a reply cannot probe what exists, and a refusal even from
// its recipient, whose reply the whole channel would read. Neither leaves
// a thread row on the wrap. Mutations killed: dropping the p-gate check in
// applyThreadReply stores both replies and counts them on the wrap; dropping
// only its addressed_to_reader test tells the outsider the wrap exists.
func TestThreadReplyToPGatedParentIsRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "parents-pgated.example", 0)
	owner, carol, alice, bob, throwaway := f.key(), f.key(), f.key(), f.key(), f.key()
	ch := f.channel(owner, false)
	wrap := f.sign(throwaway, 1059, "ciphertext", nostr.Tags{{"p", alice.PublicKeyHex()}, {"h", ch}}, f.base)
	out, err := f.p.Submit(f.ctx, f.tenant, carol.PublicKeyHex(), wrap)
	require.NoError(t, err)
	require.Equal(t, ingest.Stored, out)
	require.NotNil(t, f.eventChannel(wrap.ID), "the wrap lies in the channel, where a reply could name it")

	f.rejected(f.sign(bob, 7, "+", nostr.Tags{{"e", wrap.ID}}, 0), "invalid: reaction target event not found")
	f.rejected(f.sign(bob, 9, "re", nostr.Tags{{"h", ch}, {"e", wrap.ID, "", "root"}}, 0), "invalid: reply parent not found")
	f.rejected(f.sign(alice, 9, "re", nostr.Tags{{"h", ch}, {"e", wrap.ID, "", "reply"}}, 0), "invalid: kind 1059 events take no replies")
	require.Zero(t, f.count(`SELECT count(*) FROM thread_metadata`))
}
