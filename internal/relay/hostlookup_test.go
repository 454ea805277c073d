package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// heldLookups holds every community lookup (CommunityResolveServing) on
// its connection while hold is open, as a slow database would, and counts
// how many are held at once.
type heldLookups struct {
	hold    atomic.Pointer[chan struct{}]
	now     atomic.Int32
	most    atomic.Int32
	total   atomic.Int32 // lookups started since counting began
	count   atomic.Bool
	entered chan struct{}
}

func (h *heldLookups) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(data.SQL, "name: CommunityResolveServing") {
		return ctx
	}
	if h.count.Load() {
		h.total.Add(1)
	}
	if hold := h.hold.Load(); hold != nil {
		n := h.now.Add(1)
		for m := h.most.Load(); n > m && !h.most.CompareAndSwap(m, n); m = h.most.Load() {
		}
		select {
		case h.entered <- struct{}{}:
		default:
		}
		<-*hold
		h.now.Add(-1)
	}
	return ctx
}

func (h *heldLookups) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Every HTTP request, WebSocket upgrades and NIP-11 included, looks its
// Host up in the database before anything else, authenticated or not, and
// no connection cap counts plain HTTP. An anonymous flood of such requests
// (here 40 for the relay's host and 40 for made-up hosts, while the lookups
// are slow) must not take the pool's connections from the writers: an
// authenticated client still publishes, and at most the read slots' worth
// of lookups run at once. Measured on the dev relay before the fix: 256
// keep-alive clients sending GET / (about 3,000 a second) kept about 147
// requests waiting for a pool connection at any moment, and a member's
// publish p50 rose from 72 ms under the same flood of GET /health (no
// lookup) to 98 ms.
//
// Mutations killed: a lookup taking no read slot (the lookups hold all 8
// connections and the publish waits until they end); lookups of one host
// not sharing one statement (the 40 for the relay's host cost 40
// statements, not the held one and the one the other 39 share).
func TestAnonymousHostLookupFloodLeavesWritersTheirConnections(t *testing.T) {
	t.Parallel()
	held := &heldLookups{entered: make(chan struct{}, 1)}
	pool := dbtest.PoolOn(t, dbtest.URL(t), 8, func(c *pgxpool.Config) { c.ConnConfig.Tracer = held })
	r := relaytest.StartOn(t, pool) // 8 connections, 2 group writers: 4 read slots
	publisher := r.Dial(t, "")
	publisher.Auth(nil)

	hold := make(chan struct{})
	held.hold.Store(&hold)
	held.count.Store(true)
	released := false
	release := func() {
		if !released {
			released = true
			held.hold.Store(nil)
			close(hold)
		}
	}
	t.Cleanup(release)

	type answer struct {
		host   string
		status int
		err    error
	}
	answers := make(chan answer, 80)
	var wg sync.WaitGroup
	client := &http.Client{Timeout: time.Minute}
	for i := range 80 {
		host := r.Host
		if i%2 == 1 {
			host = fmt.Sprintf("made-up-%d.example", i)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, err := http.NewRequest(http.MethodGet, r.HTTPURL+"/", nil)
			require.NoError(t, err)
			req.Host = host
			resp, err := client.Do(req)
			if err != nil {
				answers <- answer{host: host, err: err}
				return
			}
			resp.Body.Close()
			answers <- answer{host: host, status: resp.StatusCode}
		}()
	}
	select {
	case <-held.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no lookup reached the database")
	}
	// The other 39 requests for the relay's host wait for the next lookup.
	require.Eventually(t, func() bool { return r.Server.HostLookupsJoined() == 39 }, 30*time.Second, 10*time.Millisecond,
		"requests waiting for a shared lookup of the relay's host")

	// A member publishes while the lookups are held.
	ev := publisher.Sign(1, "published during an anonymous flood", nil, 0)
	publisher.Send("EVENT", ev)
	parts, err := publisher.TryNext(20 * time.Second)
	require.NoError(t, err, "the publish found no connection while anonymous lookups held the pool (at most %d lookups held at once)", held.most.Load())
	var verb string
	require.NoError(t, json.Unmarshal(parts[0], &verb))
	require.Equal(t, "OK", verb)
	require.LessOrEqual(t, held.most.Load(), int32(4), "more lookups at once than read slots")

	release()
	wg.Wait()
	close(answers)
	for a := range answers {
		require.NoError(t, a.err, a.host)
		if a.host == r.Host {
			require.Equal(t, http.StatusOK, a.status, a.host)
		} else {
			require.Equal(t, http.StatusNotFound, a.status, a.host)
		}
	}
	require.Equal(t, int32(40+2), held.total.Load(), "statements for 40 made-up hosts and 40 requests of one host")
}
