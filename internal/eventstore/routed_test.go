package eventstore_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/replica"
)

type routeLog struct {
	mu  sync.Mutex
	got []string
}

func (l *routeLog) observe(path, decision, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, path+" "+decision+"/"+reason)
}

func (l *routeLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	got := l.got
	l.got = nil
	return got
}

// storeEvent stores a kind-9 event dated at, in channel (nil: global).
func storeEvent(t *testing.T, pool *pgxpool.Pool, community uuid.UUID, channel *uuid.UUID, content string, at time.Time) {
	t.Helper()
	ev := &nostr.Event{Kind: 9, CreatedAt: at.Unix(), Content: content}
	if channel != nil {
		ev.Tags = nostr.Tags{{"h", channel.String()}}
	}
	require.NoError(t, ev.Sign(newKey(t)))
	params, err := eventstore.InsertParams(community, ev, channel)
	require.NoError(t, err)
	n, err := db.New(pool).EventInsert(context.Background(), params)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}

func contents(t *testing.T, store *eventstore.Store, community uuid.UUID, scope eventstore.Scope, filters nostr.Filters) []string {
	t.Helper()
	var got []string
	require.NoError(t, store.Query(context.Background(), community, scope, filters, func(ev *nostr.Event, _ *uuid.UUID) error {
		got = append(got, ev.Content)
		return nil
	}))
	return got
}

// The writer and the "reader" are two databases holding different rows,
// in two communities that share a channel id. Each routed seam must answer
// from the reader only what its predicate lets the reader prove, and only
// the requested community's rows; everything else comes from the writer.
// Mutations killed: dropping the community predicate from a routed
// statement returns reader-B rows; routing a read that is not pinned to a
// channel as covered (or COUNT as covered) returns reader rows at budget 0;
// routing an agent_owner read, or a live read by freshness, records a
// routed decision.
func TestRoutedSeamsAnswerOnlyWhatTheReaderMayProve(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	writer, reader := dbtest.Pool(t), dbtest.Pool(t)
	a, b, channel := uuid.New(), uuid.New(), uuid.New()
	for _, pool := range []*pgxpool.Pool{writer, reader} {
		_, err := pool.Exec(ctx, "INSERT INTO communities (id, host) VALUES ($1, 'a.example'), ($2, 'b.example')", a, b)
		require.NoError(t, err)
	}
	old := time.Now().Add(-2 * time.Hour)
	storeEvent(t, reader, a, &channel, "reader-a-channel", old)
	storeEvent(t, reader, a, nil, "reader-a-global", old.Add(time.Second))
	storeEvent(t, reader, b, &channel, "reader-b-channel", old.Add(2*time.Second))
	storeEvent(t, writer, a, &channel, "writer-a-channel", old)
	storeEvent(t, writer, a, nil, "writer-a-global", old.Add(time.Second))

	// The reader proves token 0 of its own epoch; the wall is 20 minutes ago.
	var epoch uuid.UUID
	require.NoError(t, reader.QueryRow(ctx, "SELECT epoch FROM replica_heartbeat").Scan(&epoch))
	ring := replica.NewRing()
	ring.Record(replica.Entry{Token: 0, Epoch: epoch, CommittedAt: time.Now().Add(time.Hour), Wall: time.Now().Add(-20 * time.Minute)})
	routes := &routeLog{}
	store := eventstore.New(writer, 100)
	scope := eventstore.Scope{Channels: []uuid.UUID{channel}}
	hour := time.Now().Add(-time.Hour).Unix()
	now := time.Now().Unix()
	pinned := map[string][]string{"h": {channel.String()}}

	// Budget 0: only covered history routes.
	// The acquire budget is not under test here: a generous one keeps a
	// cold connection on a loaded machine from sending a read to the writer.
	store.Router = replica.NewRouter(reader, ring, replica.RouterOptions{Observe: routes.observe, Log: slog.New(slog.DiscardHandler), AcquireTimeout: time.Minute})
	require.Equal(t, []string{"reader-a-channel"}, contents(t, store, a, scope, nostr.Filters{{Tags: pinned, Until: &hour}}))
	require.Equal(t, []string{"channel_history replica/covered"}, routes.take())
	require.Equal(t, []string{"writer-a-channel"}, contents(t, store, a, scope, nostr.Filters{{Tags: pinned}}))
	require.Equal(t, []string{"req_historical writer/disabled"}, routes.take())
	require.Equal(t, []string{"writer-a-channel"}, contents(t, store, a, scope, nostr.Filters{{Tags: pinned, Until: &now}}))
	require.Equal(t, []string{"channel_history writer/stale"}, routes.take(), "until after the wall is not covered")
	require.Equal(t, []string{"writer-a-global", "writer-a-channel"}, contents(t, store, a, scope, nostr.Filters{{Until: &hour}}),
		"a read that can return channel-less rows is never covered")
	require.Equal(t, []string{"req_historical writer/disabled"}, routes.take())
	n, _, err := store.Count(ctx, a, scope, nostr.Filters{{Tags: pinned, Until: &hour}})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, []string{"count writer/disabled"}, routes.take(), "COUNT is never covered")
	require.Equal(t, []string{"writer-a-global", "writer-a-channel"}, contents(t, store, a, scope, nostr.Filters{{Search: "writer"}, {Tags: pinned, Until: &hour}}))
	require.Empty(t, routes.take(), "a read with a search filter stays on the writer")
	contents(t, store, a, scope, nostr.Filters{{Tags: pinned, Until: &hour, AgentOwner: strings.Repeat("ab", 32)}})
	require.Empty(t, routes.take(), "agent_owner reads who owns which agent, rows no proof covers")

	// A fresh budget: every filter read and COUNT may route, still confined
	// to the requested community and the reader's scope.
	store.Router = replica.NewRouter(reader, ring, replica.RouterOptions{MaxAge: 2 * time.Hour, Observe: routes.observe, AcquireTimeout: time.Minute})
	require.Equal(t, []string{"reader-a-global", "reader-a-channel"}, contents(t, store, a, scope, nostr.Filters{{}}))
	require.Equal(t, []string{"req_historical replica/fresh"}, routes.take())
	require.Equal(t, []string{"reader-a-channel"}, contents(t, store, a, scope, nostr.Filters{{Tags: pinned, Until: &now}}))
	require.Equal(t, []string{"channel_history replica/fresh"}, routes.take())
	require.Equal(t, []string{"reader-a-global"}, contents(t, store, a, eventstore.Scope{}, nostr.Filters{{}}), "an unreadable channel stays hidden")
	routes.take()
	require.Equal(t, []string{"reader-b-channel"}, contents(t, store, b, scope, nostr.Filters{{}}))
	routes.take()

	// A read a live subscription carries on from routes only when covered:
	// an event fanned out before the subscription and missing from a fresh
	// reader would never reach the client.
	live := eventstore.Scope{Channels: scope.Channels, Live: true}
	require.Equal(t, []string{"writer-a-global", "writer-a-channel"}, contents(t, store, a, live, nostr.Filters{{}}))
	require.Equal(t, []string{"req_historical writer/live"}, routes.take(), "a live read that cannot be covered stays on the writer")
	require.Equal(t, []string{"writer-a-channel"}, contents(t, store, a, live, nostr.Filters{{Tags: pinned, Until: &now}}))
	require.Equal(t, []string{"channel_history writer/stale"}, routes.take(), "not fresh, however fresh the reader")
	require.Equal(t, []string{"reader-a-channel"}, contents(t, store, a, live, nostr.Filters{{Tags: pinned, Until: &hour}}))
	require.Equal(t, []string{"channel_history replica/covered"}, routes.take())

	n, _, err = store.Count(ctx, a, scope, nostr.Filters{{}})
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	require.Equal(t, []string{"count replica/fresh"}, routes.take())
	n, _, err = store.Count(ctx, b, scope, nostr.Filters{{}})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	routes.take()
	// A search or agent_owner filter keeps the whole read on the writer,
	// wherever it stands among the filters, and so does a COUNT with one,
	// however fresh the reader.
	require.Equal(t, []string{"writer-a-global", "writer-a-channel"}, contents(t, store, a, scope, nostr.Filters{{}, {Search: "reader"}}))
	require.Empty(t, routes.take(), "a search after an unpinned filter stays on the writer")
	contents(t, store, a, scope, nostr.Filters{{}, {AgentOwner: strings.Repeat("ab", 32)}})
	require.Empty(t, routes.take(), "an agent_owner filter after an unpinned one stays on the writer")
	n, _, err = store.Count(ctx, a, scope, nostr.Filters{{}, {Search: "writer"}})
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "the writer's rows")
	require.Empty(t, routes.take(), "a COUNT with a search filter stays on the writer")
	_, _, err = store.Count(ctx, a, scope, nostr.Filters{{AgentOwner: strings.Repeat("ab", 32)}})
	require.NoError(t, err)
	require.Empty(t, routes.take(), "a COUNT with an agent_owner filter stays on the writer")
}

// On a standby of its own: a routed read whose standby is killed between
// pages finishes on the writer with the complete answer; afterwards a dead
// standby costs one acquire budget.
// Mutation killed: ending the read with an error when the next page's
// proof fails (instead of reading it on the writer) fails the read.
func TestRoutedReadFinishesOnTheWriterWhenTheReaderFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pair := dbtest.PrivatePair(t)
	writer, err := pgxpool.New(ctx, pair.WriterURL)
	require.NoError(t, err)
	defer writer.Close()
	community, channel := uuid.New(), uuid.New()
	_, err = writer.Exec(ctx, "INSERT INTO communities (id, host) VALUES ($1, 'a.example')", community)
	require.NoError(t, err)
	old := time.Now().Add(-2 * time.Hour)
	var want []string
	for i := 0; i < 6; i++ {
		storeEvent(t, writer, community, &channel, string(rune('f'-i)), old.Add(time.Duration(6-i)*time.Second))
		want = append(want, string(rune('f'-i)))
	}
	dbtest.WaitReplayed(t, pair.WriterURL, pair.ReaderURL)

	ring := replica.NewRing()
	probeCtx, stopProbe := context.WithCancel(ctx)
	defer stopProbe()
	go replica.NewProbe(writer, ring, replica.DefaultFloor, 20*time.Millisecond, time.Now, slog.New(slog.DiscardHandler)).Run(probeCtx)
	cfg, err := replica.ReaderPoolConfig(pair.ReaderURL, 2, 5*time.Second, 10*time.Second)
	require.NoError(t, err)
	reader, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer reader.Close()
	routes := &routeLog{}
	store := eventstore.New(writer, 100)
	store.PageRows = 2
	// Until the last step the budget is not under test: a generous one
	// keeps a slow connection health check from sending a read to the writer.
	store.Router = replica.NewRouter(reader, ring, replica.RouterOptions{Observe: routes.observe, AcquireTimeout: time.Minute})
	scope := eventstore.Scope{Channels: []uuid.UUID{channel}}
	hour := time.Now().Add(-time.Hour).Unix()
	filters := nostr.Filters{{Tags: map[string][]string{"h": {channel.String()}}, Until: &hour}}
	require.Eventually(t, func() bool {
		contents(t, store, community, scope, filters)
		got := routes.take()
		return len(got) == 1 && got[0] == "channel_history replica/covered"
	}, 30*time.Second, 20*time.Millisecond)

	readWith := func(between func()) []string {
		var got []string
		require.NoError(t, store.Query(ctx, community, scope, filters, func(ev *nostr.Event, _ *uuid.UUID) error {
			got = append(got, ev.Content)
			if len(got) == 2 {
				between()
			}
			return nil
		}))
		return got
	}

	got := readWith(func() { require.NoError(t, pair.Standby.Kill()) })
	require.Equal(t, want, got)
	// The pooled connection fails its BEGIN (validation_error), or, idle
	// long enough to be pinged first, is replaced by a dial the dead
	// standby refuses (acquire_timeout): either way one writer decision.
	decided := routes.take()
	require.Len(t, decided, 1)
	require.True(t, strings.HasPrefix(decided[0], "channel_history writer/reader_"), decided[0])

	// The standby is dead, so its refusal comes at once: this checks the
	// read still ends within one budget. 3 s, so the writer's read on a
	// loaded machine has 2.75 s before it could look like two budgets (at
	// 1 s it had 0.75 s); the retry mutation is TestFallbackSpendsOneAcquireBudget's.
	const budget = 3 * time.Second
	store.Router = replica.NewRouter(reader, ring, replica.RouterOptions{Observe: routes.observe, AcquireTimeout: budget})
	start := time.Now()
	require.Equal(t, want, contents(t, store, community, scope, filters))
	require.Less(t, time.Since(start), 2*budget-250*time.Millisecond, "one acquire budget, not two")
	require.Equal(t, []string{"channel_history writer/reader_acquire_timeout"}, routes.take())
}

// A page whose statement fails on the reader after its proof (a
// recovery-conflict cancellation, the standby going away mid-statement) is
// read again on the writer, and the read finishes there: the client never
// gets a partial page, nor an error the writer could have answered.
// Mutation killed: returning the reader's error instead of re-running the
// page on the writer (onSession).
func TestRoutedPageFailingOnTheReaderIsReadOnTheWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	writer, reader := dbtest.Pool(t), dbtest.Pool(t)
	community, channel := uuid.New(), uuid.New()
	old := time.Now().Add(-2 * time.Hour)
	for _, pool := range []*pgxpool.Pool{writer, reader} {
		_, err := pool.Exec(ctx, "INSERT INTO communities (id, host) VALUES ($1, 'a.example')", community)
		require.NoError(t, err)
	}
	key := newKey(t)
	for i := 0; i < 4; i++ { // the same events on both
		ev := &nostr.Event{Kind: 9, CreatedAt: old.Add(time.Duration(10-i) * time.Minute).Unix(), Content: string(rune('d' - i)),
			Tags: nostr.Tags{{"h", channel.String()}}}
		require.NoError(t, ev.Sign(key))
		params, err := eventstore.InsertParams(community, ev, &channel)
		require.NoError(t, err)
		for _, pool := range []*pgxpool.Pool{writer, reader} {
			_, err = db.New(pool).EventInsert(ctx, params)
			require.NoError(t, err)
		}
	}
	var epoch uuid.UUID
	require.NoError(t, reader.QueryRow(ctx, "SELECT epoch FROM replica_heartbeat").Scan(&epoch))
	ring := replica.NewRing()
	ring.Record(replica.Entry{Token: 0, Epoch: epoch, CommittedAt: time.Now().Add(time.Hour), Wall: time.Now().Add(-20 * time.Minute)})
	routes := &routeLog{}
	store := eventstore.New(writer, 100)
	store.PageRows = 2
	store.Router = replica.NewRouter(reader, ring, replica.RouterOptions{Observe: routes.observe, AcquireTimeout: time.Minute})
	hour := time.Now().Add(-time.Hour).Unix()
	var got []string
	require.NoError(t, store.Query(ctx, community, eventstore.Scope{Channels: []uuid.UUID{channel}},
		nostr.Filters{{Tags: map[string][]string{"h": {channel.String()}}, Until: &hour}},
		func(ev *nostr.Event, _ *uuid.UUID) error {
			if got = append(got, ev.Content); len(got) == 1 {
				// The next proof still succeeds; the page statement fails.
				_, err := reader.Exec(ctx, "ALTER TABLE events RENAME TO events_gone")
				require.NoError(t, err)
			}
			return nil
		}))
	require.Equal(t, []string{"d", "c", "b", "a"}, got)
	require.Equal(t, []string{"channel_history writer/replica_error"}, routes.take())
}

// A routed read holds no reader connection while its client takes the
// rows of a page: a slow client (the relay drops one only after its write
// timeout) would otherwise keep a reader connection, and a standby
// snapshot, for as long as it reads, and a few of them would send every
// other routed read to the writer after a full acquire budget. The next
// page proves a snapshot of its own, and the read is still recorded once.
// Mutation killed: not parking the session before handing a page to the
// client (the one reader connection stays taken: the read nested in the
// client's callback waits out its budget and goes to the writer).
func TestRoutedReadHoldsNoReaderConnectionWhileTheClientDrains(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	writer := dbtest.Pool(t)
	readerURL := dbtest.URL(t) // any database with the heartbeat serves as the reader
	cfg, err := replica.ReaderPoolConfig(readerURL, 1, 5*time.Second, 10*time.Second)
	require.NoError(t, err)
	reader, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer reader.Close()
	community, channel := uuid.New(), uuid.New()
	for _, pool := range []*pgxpool.Pool{writer, reader} {
		_, err := pool.Exec(ctx, "INSERT INTO communities (id, host) VALUES ($1, 'a.example')", community)
		require.NoError(t, err)
	}
	old := time.Now().Add(-2 * time.Hour)
	for i := 0; i < 4; i++ {
		storeEvent(t, reader, community, &channel, string(rune('d'-i)), old.Add(time.Duration(10-i)*time.Minute))
	}
	var epoch uuid.UUID
	require.NoError(t, reader.QueryRow(ctx, "SELECT epoch FROM replica_heartbeat").Scan(&epoch))
	ring := replica.NewRing()
	ring.Record(replica.Entry{Token: 0, Epoch: epoch, CommittedAt: time.Now().Add(time.Hour), Wall: time.Now().Add(-20 * time.Minute)})
	routes := &routeLog{}
	store := eventstore.New(writer, 100)
	store.PageRows = 2
	store.Router = replica.NewRouter(reader, ring, replica.RouterOptions{Observe: routes.observe, AcquireTimeout: 10 * time.Second}) // a failure bound: the first read dials
	hour := time.Now().Add(-time.Hour).Unix()
	scope := eventstore.Scope{Channels: []uuid.UUID{channel}}
	filters := nostr.Filters{{Tags: map[string][]string{"h": {channel.String()}}, Until: &hour}}
	var got, nested []string
	var held int32
	require.NoError(t, store.Query(ctx, community, scope, filters, func(ev *nostr.Event, _ *uuid.UUID) error {
		if got = append(got, ev.Content); len(got) == 1 {
			// The client is slow: meanwhile another read routes.
			held = reader.Stat().AcquiredConns()
			nested = contents(t, store, community, scope, filters)
		}
		return nil
	}))
	require.Equal(t, []string{"d", "c", "b", "a"}, got)
	require.Equal(t, got, nested)
	require.Zero(t, held, "no reader connection held while the client takes a page")
	require.Equal(t, []string{"channel_history replica/covered", "channel_history replica/covered"}, routes.take(),
		"the nested read routed, and each read recorded once")
}

// A routed read whose proof goes stale while a slow client drains its
// pages finishes on the writer: covered proves insertions only, so a row
// deleted after the proof would otherwise be served for as long as the
// client keeps reading, past the 30 s docs/replica.md promises.
// Mutation killed: dropping the Holds check in onSession (the reader
// serves every page, recorded replica/covered).
func TestRoutedReadLeavesAProofThatWentStale(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	writer, reader := dbtest.Pool(t), dbtest.Pool(t)
	community, channel := uuid.New(), uuid.New()
	for _, pool := range []*pgxpool.Pool{writer, reader} {
		_, err := pool.Exec(ctx, "INSERT INTO communities (id, host) VALUES ($1, 'a.example')", community)
		require.NoError(t, err)
	}
	old := time.Now().Add(-2 * time.Hour)
	for i := 0; i < 4; i++ {
		storeEvent(t, reader, community, &channel, string(rune('d'-i)), old.Add(time.Duration(10-i)*time.Minute))
	}
	// The writer no longer holds b and a (deleted since the proof); it holds
	// rows of its own below the first page.
	storeEvent(t, writer, community, &channel, "writer-later", old.Add(9*time.Minute+30*time.Second))
	storeEvent(t, writer, community, &channel, "writer-older", old.Add(5*time.Minute))
	var epoch uuid.UUID
	require.NoError(t, reader.QueryRow(ctx, "SELECT epoch FROM replica_heartbeat").Scan(&epoch))
	var mu sync.Mutex
	clock := time.Now()
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	ring := replica.NewRing()
	ring.Record(replica.Entry{Token: 0, Epoch: epoch, CommittedAt: clock, Wall: clock.Add(-20 * time.Minute)})
	routes := &routeLog{}
	store := eventstore.New(writer, 100)
	store.PageRows = 2
	store.Router = replica.NewRouter(reader, ring, replica.RouterOptions{Observe: routes.observe, AcquireTimeout: time.Minute, Now: now})
	hour := time.Now().Add(-time.Hour).Unix()
	var got []string
	require.NoError(t, store.Query(ctx, community, eventstore.Scope{Channels: []uuid.UUID{channel}},
		nostr.Filters{{Tags: map[string][]string{"h": {channel.String()}}, Until: &hour}},
		func(ev *nostr.Event, _ *uuid.UUID) error {
			if got = append(got, ev.Content); len(got) == 2 {
				mu.Lock()
				clock = clock.Add(replica.Staleness + time.Second) // the client took its time
				mu.Unlock()
			}
			return nil
		}))
	require.Equal(t, []string{"d", "c", "writer-older"}, got, "the first page from the reader, the rest from the writer")
	require.Equal(t, []string{"channel_history writer/stale"}, routes.take())
}

// A reader that stops answering in the middle of a page's statement (a
// frozen standby enforces no statement_timeout of its own) costs the read
// the router's statement bound, not the caller's whole budget: the page is
// read again from the writer. Here the page's statement waits on a lock
// the reader never grants while the read lasts.
// Mutation killed: running the reader statement under the caller's
// context only (it waits until the lock goes, 20 s later, and the reader
// serves the read: replica/covered).
func TestRoutedReadStuckOnTheReaderFinishesOnTheWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	writer, reader := dbtest.Pool(t), dbtest.Pool(t)
	community, channel := uuid.New(), uuid.New()
	for _, pool := range []*pgxpool.Pool{writer, reader} {
		_, err := pool.Exec(ctx, "INSERT INTO communities (id, host) VALUES ($1, 'a.example')", community)
		require.NoError(t, err)
	}
	old := time.Now().Add(-2 * time.Hour)
	storeEvent(t, reader, community, &channel, "from the reader", old)
	storeEvent(t, writer, community, &channel, "from the writer", old)
	var epoch uuid.UUID
	require.NoError(t, reader.QueryRow(ctx, "SELECT epoch FROM replica_heartbeat").Scan(&epoch))
	ring := replica.NewRing()
	ring.Record(replica.Entry{Token: 0, Epoch: epoch, CommittedAt: time.Now().Add(time.Hour), Wall: time.Now().Add(-20 * time.Minute)})

	locker, err := reader.Acquire(ctx)
	require.NoError(t, err)
	defer locker.Release()
	lock, err := locker.Begin(ctx)
	require.NoError(t, err)
	_, err = lock.Exec(ctx, "LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	release := time.AfterFunc(20*time.Second, func() { _ = lock.Rollback(context.Background()) })
	defer release.Stop()

	routes := &routeLog{}
	store := eventstore.New(writer, 100)
	store.StatementTimeout = time.Minute
	store.Router = replica.NewRouter(reader, ring, replica.RouterOptions{
		Observe: routes.observe, AcquireTimeout: 5 * time.Second, StatementTimeout: 200 * time.Millisecond})
	hour := time.Now().Add(-time.Hour).Unix()
	got := contents(t, store, community, eventstore.Scope{Channels: []uuid.UUID{channel}},
		nostr.Filters{{Tags: map[string][]string{"h": {channel.String()}}, Until: &hour}})
	require.Equal(t, []string{"from the writer"}, got)
	require.Equal(t, []string{"channel_history writer/replica_error"}, routes.take())
	require.NoError(t, lock.Rollback(ctx))
}
