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

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// heldStatements holds every statement of one name on its connection
// while hold is open, as a slow database would, and counts how many are
// held at once.
type heldStatements struct {
	name    string
	hold    atomic.Pointer[chan struct{}]
	now     atomic.Int32
	most    atomic.Int32
	total   atomic.Int32 // lookups started since counting began
	count   atomic.Bool
	entered chan struct{}
}

func (h *heldStatements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	// sqlc names a statement "-- name: X :kind", the relay's own "-- name: X\n".
	if !strings.HasPrefix(data.SQL, "-- name: "+h.name+" ") && !strings.HasPrefix(data.SQL, "-- name: "+h.name+"\n") {
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

func (h *heldStatements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// start holds and counts the statements from now until release.
func (h *heldStatements) start(t *testing.T) (release func()) {
	hold := make(chan struct{})
	h.hold.Store(&hold)
	h.count.Store(true)
	var once sync.Once
	release = func() {
		once.Do(func() {
			h.hold.Store(nil)
			close(hold)
		})
	}
	t.Cleanup(release)
	return release
}

// publishes requires that c's event is answered OK within a bound far
// beyond a publish's milliseconds.
func publishes(t *testing.T, c *relaytest.Client, why string) {
	t.Helper()
	ev := c.Sign(1, why, nil, 0)
	c.Send("EVENT", ev)
	require.Equal(t, "OK", nextVerb(t, c, 20*time.Second), "the publish found no connection: %s", why)
}

// writersServedWhileSlotsHeld waits until the 4 read slots hold stalled
// statements, then a second for other statements to reach the pool if they
// can (a relay without the bound fills it within milliseconds), and
// requires that publisher still publishes and that no more than the slots'
// worth of what ran at once.
func writersServedWhileSlotsHeld(t *testing.T, held *heldStatements, publisher *relaytest.Client, why, what string) {
	t.Helper()
	require.Eventually(t, func() bool { return held.now.Load() >= 4 }, 30*time.Second, 10*time.Millisecond)
	time.Sleep(time.Second)
	publishes(t, publisher, why)
	require.LessOrEqual(t, held.most.Load(), int32(4), "more %s at once than read slots", what)
}

// floodFrom is the header of a flood's i-th connection or request, from
// floodAddr(i).
func floodFrom(i int) http.Header {
	return http.Header{"X-Forwarded-For": {floodAddr(i)}}
}

// floodAddr is the client address of a flood's i-th request: one of two,
// since one address holds at most half of the read slots and a flood
// must fill them all.
func floodAddr(i int) string { return fmt.Sprintf("203.0.113.%d", 1+i%2) }

// relayWithHeldStatement starts a relay on an 8-connection pool (2 group
// writers: 4 read slots) whose statement named statement can be held
// (heldStatements.start), and a client authenticated on it to publish
// meanwhile. The relay believes X-Forwarded-For from loopback, so a test
// may send from several client addresses (floodFrom).
func relayWithHeldStatement(t *testing.T, statement string, opts []relay.Option, adjust ...func(*config.Config)) (*heldStatements, *relaytest.Relay, *relaytest.Client) {
	t.Helper()
	held := &heldStatements{name: statement, entered: make(chan struct{}, 1)}
	pool := dbtest.PoolOn(t, dbtest.URL(t), 8, func(c *pgxpool.Config) { c.ConnConfig.Tracer = held })
	trustLoopback := func(c *config.Config) { c.TrustedProxies = mustPrefixes(t, "127.0.0.1") }
	r := relaytest.StartWith(t, pool, opts, append([]func(*config.Config){trustLoopback}, adjust...)...)
	publisher := r.Dial(t, "")
	publisher.Auth(nil)
	return held, r, publisher
}

// nextVerb is the verb of c's next message, which must come within wait.
func nextVerb(t *testing.T, c *relaytest.Client, wait time.Duration) string {
	t.Helper()
	parts, err := c.TryNext(wait)
	require.NoError(t, err)
	var verb string
	require.NoError(t, json.Unmarshal(parts[0], &verb))
	return verb
}

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
	held, r, publisher := relayWithHeldStatement(t, "CommunityResolveServing", nil)

	release := held.start(t)

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

	publishes(t, publisher, "published while anonymous lookups are held")
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

// Any key signs a valid NIP-98 request, and the HTTP bridge counts no
// requests per key or address (only POST /events takes the publish rate),
// so the statements of a signed GET are anyone's to multiply: the claim
// of its auth event, an insert, and the route's own reads. A flood of 40
// signed GET /v1/users/{pubkey}/recorded-owner, each with a fresh key,
// while one of those statements is slow, must leave the writers their
// connections, as the anonymous flood above does.
//
// Mutations killed: the claim (HTTPAuthReplayClaim) taking no read slot;
// the route's read (UserRecordedOwner) taking none. Either way the 40 hold
// all 8 connections and the publish is never answered.
func TestSignedHTTPFloodWithFreshKeysLeavesWritersTheirConnections(t *testing.T) {
	t.Parallel()
	for _, statement := range []string{"HTTPAuthReplayClaim", "UserRecordedOwner"} {
		t.Run(statement, func(t *testing.T) {
			t.Parallel()
			held, r, publisher := relayWithHeldStatement(t, statement, nil)
			path := "/v1/users/" + relaytest.NewKey(t).PublicKeyHex() + "/recorded-owner"
			requests := make([]*http.Request, 40)
			for i := range requests {
				req, err := http.NewRequest(http.MethodGet, r.HTTPURL+path, nil)
				require.NoError(t, err)
				req.Header.Set("Authorization", authHeader(nip98(t, relaytest.NewKey(t), "GET", r.HTTPURL+path, nil, nil)))
				req.Header.Set("X-Forwarded-For", floodAddr(i))
				requests[i] = req
			}
			release := held.start(t)
			statuses := make(chan int, len(requests))
			for _, req := range requests {
				go func() {
					resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
					if err != nil {
						statuses <- 0
						return
					}
					resp.Body.Close()
					statuses <- resp.StatusCode
				}()
			}
			select {
			case <-held.entered:
			case <-time.After(30 * time.Second):
				t.Fatalf("no %s reached the database", statement)
			}
			// The slots full, then a second for the other requests to
			// reach the pool if they can: the bound holds however long
			// this waits, and a relay without it fills the pool within
			// milliseconds.
			writersServedWhileSlotsHeld(t, held, publisher, "published while signed requests' statements are held", statement)
			release()
			for range requests {
				require.Equal(t, http.StatusNotFound, <-statuses, "no owner recorded")
			}
		})
	}
}

// Any client may AUTH as a fresh key before each REQ, and a reader's first
// REQ reads its readable channels (ChannelsReadable) from the database: 40
// connections doing so while that statement is slow must leave the writers
// their connections.
//
// Mutation killed: readScope reading the channels without a read slot (the
// 40 hold all 8 connections and the publish is never answered).
func TestFreshKeyREQFloodLeavesWritersTheirConnections(t *testing.T) {
	t.Parallel()
	held, r, publisher := relayWithHeldStatement(t, "ChannelsReadable", nil)
	readers := make([]*relaytest.Client, 40)
	for i := range readers {
		readers[i] = r.DialWith(t, "", floodFrom(i))
		readers[i].Auth(nil)
	}
	release := held.start(t)
	for _, c := range readers {
		c.Send("REQ", "s", map[string]any{"kinds": []int{1}})
	}
	// The slots full, then a second for the other REQs to reach the pool
	// if they can (see TestSignedHTTPFloodWithFreshKeysLeavesWritersTheirConnections).
	writersServedWhileSlotsHeld(t, held, publisher, "published while fresh readers' channel reads are held", "channel reads")
	release()
	for _, c := range readers {
		require.Contains(t, []string{"EVENT", "EOSE"}, nextVerb(t, c, 30*time.Second))
	}
}

// Typing and presence in a channel are checked against the channel (a
// ChannelAccess statement on the pool, outside the group writers) and
// relayed, never stored: any key may send them, a fresh key with a fresh
// publish rate. 40 connections sending typing with fresh keys while that
// statement is slow must leave the writers their connections.
//
// Mutation killed: the ephemeral channel check taking no read slot (the 40
// hold all 8 connections and the publish is never answered).
func TestFreshKeyTypingFloodLeavesWritersTheirConnections(t *testing.T) {
	t.Parallel()
	held, r, publisher := relayWithHeldStatement(t, "ChannelAccess", nil)
	ch := createChannel(t, publisher, "open", false)
	typists := make([]*relaytest.Client, 40)
	for i := range typists {
		typists[i] = r.DialWith(t, "", floodFrom(i))
		typists[i].Auth(nil)
	}
	release := held.start(t)
	for _, c := range typists {
		c.Send("EVENT", c.Sign(20002, "", nostr.Tags{{"h", ch}}, 0))
	}
	// The slots full, then a second for the others to reach the pool if
	// they can (see TestSignedHTTPFloodWithFreshKeysLeavesWritersTheirConnections).
	writersServedWhileSlotsHeld(t, held, publisher, "published while fresh keys' typing checks are held", "typing checks")
	release()
	for _, c := range typists {
		require.Equal(t, "OK", nextVerb(t, c, 30*time.Second))
	}
}

// A webhook call reads its workflow before it can check the secret, so
// anyone may make the relay run that statement: 40 anonymous calls naming
// made-up workflows while it is slow must leave the writers their
// connections, and each is then refused as a wrong secret.
//
// Mutation killed: the webhook's statements taking no read slot (the 40
// hold all 8 connections and the publish is never answered).
func TestAnonymousWebhookFloodLeavesWritersTheirConnections(t *testing.T) {
	t.Parallel()
	held, r, publisher := relayWithHeldStatement(t, "WorkflowGet", nil)
	release := held.start(t)
	statuses := make(chan int, 40)
	for i := range 40 {
		go func() {
			url := fmt.Sprintf("%s/hooks/00000000-0000-4000-8000-%012d", r.HTTPURL, i)
			req, err := http.NewRequest(http.MethodPost, url, strings.NewReader("{}"))
			if err != nil {
				statuses <- 0
				return
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Forwarded-For", floodAddr(i))
			resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
			if err != nil {
				statuses <- 0
				return
			}
			resp.Body.Close()
			statuses <- resp.StatusCode
		}()
	}
	// The slots full, then a second for the others to reach the pool if
	// they can (see TestSignedHTTPFloodWithFreshKeysLeavesWritersTheirConnections).
	writersServedWhileSlotsHeld(t, held, publisher, "published while anonymous webhook calls are held", "webhook reads")
	release()
	for range 40 {
		require.Equal(t, http.StatusUnauthorized, <-statuses)
	}
}

// Any key may AUTH, and an AUTH carrying an owner attestation reads the
// agent's recorded owner and, when there is none, records it: a fresh
// agent key signed for by a fresh owner key costs the relay both
// statements on the pool, outside the group writers. 40 connections doing
// so while either statement is slow must leave the writers their
// connections, and each AUTH then succeeds with its owner recorded.
//
// Mutation killed: recordOwner taking no read slot (the 40 hold all 8
// connections and the publish is never answered).
func TestFreshKeyAuthAttestationFloodLeavesWritersTheirConnections(t *testing.T) {
	t.Parallel()
	for _, statement := range []string{"UserChannelAddPolicy", "UserAgentOwnerRecord"} {
		t.Run(statement, func(t *testing.T) {
			t.Parallel()
			held, r, publisher := relayWithHeldStatement(t, statement, nil)
			agents := make([]*relaytest.Client, 40)
			auths := make([]*nostr.Event, len(agents))
			owners := make([]string, len(agents))
			for i := range agents {
				agents[i] = r.DialWith(t, "", floodFrom(i))
				agent, owner := relaytest.NewKey(t), relaytest.NewKey(t)
				auths[i] = agents[i].AuthEvent(agent)
				auths[i].Tags = append(auths[i].Tags, attest(t, owner, agent.PublicKeyHex(), ""))
				require.NoError(t, auths[i].Sign(agent))
				owners[i] = owner.PublicKeyHex()
			}
			release := held.start(t)
			for i, c := range agents {
				c.Send("AUTH", auths[i])
			}
			writersServedWhileSlotsHeld(t, held, publisher, "published while fresh agents' owner attestations are held", statement)
			release()
			for i, c := range agents {
				ok := c.Expect("OK")
				require.True(t, ok.OK, ok.Msg)
				require.Equal(t, owners[i], recordedOwner(t, r, auths[i].PubKey))
			}
		})
	}
}
