package eventstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// statementCounter counts the statements a pool runs, by their name line,
// and the rows they return.
type statementCounter struct {
	names chan string
	rows  atomic.Int64
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if name, ok := strings.CutPrefix(data.SQL, "-- name: "); ok {
		name, _, _ = strings.Cut(name, "\n")
		select {
		case c.names <- name:
		default:
		}
	}
	return ctx
}

func (c *statementCounter) TraceQueryEnd(_ context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if strings.HasPrefix(data.CommandTag.String(), "SELECT") {
		c.rows.Add(data.CommandTag.RowsAffected())
	}
}

func (c *statementCounter) drain() map[string]int {
	out := map[string]int{}
	for {
		select {
		case n := <-c.names:
			out[n]++
		default:
			return out
		}
	}
}

// Reading in small pages returns exactly what one big page returns (order,
// per-filter limits, one copy of an event several filters match), with one
// statement per page, each finished (its connection released) before fn
// sees its rows. Pages cut short by PageBytes do too.
// Mutations killed (PageBytes): a cut page taken as the last one (rows
// missing), a cut page that keeps one event's duplicates split across it
// (an event sent twice or a filter's limit miscounted).
func TestPagedQueryMatchesASingleRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dbtest.URL(t))
	require.NoError(t, err)
	counter := &statementCounter{names: make(chan string, 100000)}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	q := db.New(pool)
	home, err := q.CommunityCreate(ctx, "paging.example")
	require.NoError(t, err)

	rng := rand.New(rand.NewPCG(3, 4))
	keys := make([]*nostr.SecretKey, 3)
	for i := range keys {
		keys[i], err = nostr.GenerateSecretKey()
		require.NoError(t, err)
	}
	for i := 0; i < 150; i++ {
		tags := nostr.Tags{}
		if rng.IntN(2) == 0 {
			tags = append(tags, nostr.Tag{"t", []string{"a", "b"}[rng.IntN(2)]})
		}
		// Few distinct seconds: many ties, so the id tiebreaker matters.
		// Contents repeat words a varying number of times: search ranks
		// differ, and tie often.
		content := fmt.Sprint(i, " ", strings.Repeat("hive ", rng.IntN(4)), strings.Repeat("honey ", rng.IntN(3)))
		ev := &nostr.Event{Kind: []int{1, 7}[rng.IntN(2)], CreatedAt: 1_700_000_000 + int64(rng.IntN(20)), Tags: tags, Content: content}
		require.NoError(t, ev.Sign(keys[rng.IntN(len(keys))]))
		params, err := eventstore.InsertParams(home.ID, ev, nil)
		require.NoError(t, err)
		_, err = q.EventInsert(ctx, params)
		require.NoError(t, err)
	}
	limit := func(n int) *int { return &n }
	scope := eventstore.Scope{Reader: keys[0].PublicKeyHex()}
	read := func(pageRows, pageBytes int, filters nostr.Filters) ([]string, map[string]int) {
		store := eventstore.New(pool, 100)
		store.PageRows, store.PageBytes = pageRows, pageBytes
		counter.drain()
		counter.rows.Store(0)
		var got []string
		first := true
		require.NoError(t, store.Query(ctx, home.ID, scope, filters, func(ev *nostr.Event, _ *uuid.UUID) error {
			if first {
				first = false
				require.Zero(t, pool.Stat().AcquiredConns(), "no connection is held while rows are sent")
				require.Equal(t, 1, len(counter.drain()), "rows are sent after the first page, before the next is read")
			}
			got = append(got, ev.ID)
			return nil
		}))
		return got, counter.drain()
	}
	for _, filters := range []nostr.Filters{
		{{}},
		{{Kinds: []int{1}, Limit: limit(37)}},
		{{Kinds: []int{1}}, {Tags: map[string][]string{"t": {"a"}}, Limit: limit(40)}, {Authors: []string{keys[1].PublicKeyHex()}, Limit: limit(9)}},
		{{Kinds: []int{7}, Limit: limit(3)}, {Kinds: []int{1, 7}, Limit: limit(80)}},
		{{Search: "hive"}},
		{{Search: "hive honey", Kinds: []int{1}, Limit: limit(33)}},
		{{Search: "honey", Limit: limit(20)}, {Kinds: []int{7}, Limit: limit(25)}, {Search: "hive", Limit: limit(15)}},
	} {
		want, _ := read(10000, 0, filters)
		require.NotEmpty(t, want)
		for _, pageRows := range []int{1, 4, 7, 50} {
			got, statements := read(pageRows, 0, filters)
			require.Equal(t, want, got, "pages of %d, filters %+v", pageRows, filters)
			require.GreaterOrEqual(t, statements[eventstore.NameEventsPage]+statements[eventstore.NameEventsSearch], len(want)/max(pageRows, len(filters)+1)-1, "one statement per page")
		}
		// Each event's JSON is about 350 bytes: a page of 1 byte holds only
		// the rows it needs to advance, one of 1,000 a few events.
		// A page cut by bytes still read its other rows off the connection;
		// the next one asks for about as many rows as fitted, so the rows
		// read stay a small multiple of the rows sent, not one page of
		// 10,000 rows per few events sent.
		for _, pageBytes := range []int{1, 1000} {
			got, statements := read(10000, pageBytes, filters)
			require.Equal(t, want, got, "pages of %d bytes, filters %+v", pageBytes, filters)
			require.GreaterOrEqual(t, statements[eventstore.NameEventsPage]+statements[eventstore.NameEventsSearch], len(want)/(len(filters)+4), "pages cut by bytes")
			require.LessOrEqual(t, counter.rows.Load(), int64(4*len(filters)*len(want)+200), "rows read for %d sent, pages of %d bytes, filters %+v", len(want), pageBytes, filters)
		}
	}
}

// Each statement gets StatementTimeout, and running out of it is reported as
// a deadline, which the relay answers with "query timed out".
func TestStatementTimeoutIsADeadline(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	store := eventstore.New(pool, 10)
	store.StatementTimeout = time.Nanosecond
	err := store.Query(context.Background(), uuid.New(), eventstore.Scope{}, nostr.Filters{{}}, func(*nostr.Event, *uuid.UUID) error { return nil })
	require.ErrorIs(t, err, context.DeadlineExceeded)
	err = store.Query(context.Background(), uuid.New(), eventstore.Scope{}, nostr.Filters{{Search: "x"}}, func(*nostr.Event, *uuid.UUID) error { return nil })
	require.ErrorIs(t, err, context.DeadlineExceeded)
}
