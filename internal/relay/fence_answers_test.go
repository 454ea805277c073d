package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/deletion"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

const beingDeleted = "blocked: this community is being deleted"

// httpAnswer is a status and a decoded JSON body, read off the test
// goroutine (no require there).
type httpAnswer struct {
	status int
	body   map[string]any
	err    error
}

func doJSON(req *http.Request) httpAnswer {
	resp, err := bridgeHTTP.Do(req)
	if err != nil {
		return httpAnswer{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return httpAnswer{err: err}
	}
	out := httpAnswer{status: resp.StatusCode}
	if resp.Header.Get("Content-Type") != "application/json" {
		out.err = fmt.Errorf("content type %q: %s", resp.Header.Get("Content-Type"), raw)
		return out
	}
	out.err = json.Unmarshal(raw, &out.body)
	return out
}

// postEventRequest is a NIP-98 signed POST /events of ev to the home
// community, ready to send from any goroutine.
func postEventRequest(t *testing.T, r *relaytest.Relay, key *nostr.SecretKey, ev *nostr.Event) *http.Request {
	t.Helper()
	body := encodeBody(t, ev)
	req, err := http.NewRequest(http.MethodPost, r.HTTPURL+"/events", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", authHeader(nip98(t, key, "POST", r.HTTPURL+"/events", body, nil)))
	req.Header.Set("Content-Type", "application/json")
	return req
}

// approveDeletion submits, approves and claims the deletion of the
// community at host, leaving it active: beginQuiescing takes the next step.
func approveDeletion(t *testing.T, pool *pgxpool.Pool, host string) db.CommunityDeletionRequest {
	t.Helper()
	ctx := context.Background()
	req, err := deletion.Submit(ctx, pool, nil, host, "ops@example", "test")
	require.NoError(t, err)
	req, err = deletion.Approve(ctx, pool, req.ID, "lead@example", "test")
	require.NoError(t, err)
	row, err := db.New(pool).DeletionRequestClaim(ctx, db.DeletionRequestClaimParams{ID: &req.ID, Owner: "test", LeaseSeconds: 3600})
	require.NoError(t, err)
	return row
}

// holdTable locks table against writes (EXCLUSIVE: reads go on) until the
// returned release.
func holdTable(t *testing.T, pool *pgxpool.Pool, table string) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{table}.Sanitize()+" IN EXCLUSIVE MODE")
	require.NoError(t, err)
	var once sync.Once
	release = func() { once.Do(func() { require.NoError(t, tx.Commit(ctx)) }) }
	t.Cleanup(release)
	return release
}

// awaitInsertInto waits until a session's INSERT into table waits for its
// lock (the relay's own maintenance and workers may wait for it too).
func awaitInsertInto(t *testing.T, pool *pgxpool.Pool, table string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var waiting bool
		err := pool.QueryRow(context.Background(), `SELECT EXISTS (
			SELECT FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.relation = $1::regclass AND NOT l.granted AND a.query LIKE '%INSERT INTO ' || $1 || ' %')`, table).Scan(&waiting)
		return err == nil && waiting
	}, 30*time.Second, 5*time.Millisecond, "no insert into %s waits", table)
}

// acrossQuiescing runs send while the community at host begins its
// deletion under it: send's first write to table waits (the table held),
// the community goes quiescing, and only then is the write let through,
// so its fence check reads quiescing. This is the window between the start
// of quiescing and the closing of the community's connections (a request
// that resolved its community just before, a socket whose relay missed
// the announcement), made wide enough to hit every time.
func acrossQuiescing(t *testing.T, pool *pgxpool.Pool, host, table string, send func() httpAnswer) httpAnswer {
	t.Helper()
	row := approveDeletion(t, pool, host)
	release := holdTable(t, pool, table)
	answer := make(chan httpAnswer, 1)
	go func() { answer <- send() }()
	awaitInsertInto(t, pool, table)
	require.NoError(t, db.New(pool).DeletionRequestBeginQuiescing(context.Background(),
		db.DeletionRequestBeginQuiescingParams{ID: row.ID, Owner: "test", Generation: row.LeaseGeneration}))
	release()
	got := <-answer
	require.NoError(t, got.err)
	return got
}

// A socket still open on a community that began its deletion (its relay
// missed the announcement that closes it, and the sweep has not run) gets
// a clear refusal for a stored write, not "try again", and a client
// publishing into another community on the same relay meanwhile, in the
// same commit groups, keeps every event. Mutations killed: mapError not
// mapping the fence (the old "error: could not store the event; try
// again"); AUTH answering the fence at the owner attestation "try again".
func TestFencedWriteOverWebSocketSaysTheCommunityIsBeingDeleted(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	r := relaytest.StartOn(t, pool, func(c *config.Config) { c.ClosedCommunitySweep = time.Hour })
	_, err := pool.Exec(context.Background(), `ALTER TABLE communities DISABLE TRIGGER communities_announce_closed`)
	require.NoError(t, err)
	// The relay sweeps for closed communities once its announcement
	// listener is up; a late first sweep (a loaded machine) would close
	// the sockets below. Dialed after it, they meet no sweep for an hour.
	require.Eventually(t, func() bool {
		var listening bool
		err := pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'idle' AND query = 'LISTEN ' || $1)`, community.ClosedChannel).Scan(&listening)
		return err == nil && listening
	}, 30*time.Second, 5*time.Millisecond, "the relay's closing announcements listener is not up")
	const otherHost = "other.example"
	r.AddCommunity(t, otherHost)
	going := r.Dial(t, r.Host)
	going.Auth(nil)
	staying := r.Dial(t, otherHost)
	staying.Auth(nil)
	unauthenticated := r.Dial(t, r.Host)
	quiesceCommunity(t, pool, r.Host)

	// Both clients send their events without waiting for answers, so the
	// relay groups the two communities' events into shared commits.
	const n = 20
	var wg sync.WaitGroup
	for _, c := range []*relaytest.Client{going, staying} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				c.Send("EVENT", c.Sign(1, fmt.Sprintf("note %d", i), nil, 0))
			}
		}()
	}
	wg.Wait()
	for range n {
		got := going.Expect("OK")
		require.False(t, got.OK)
		require.Equal(t, beingDeleted, got.Msg)
		require.True(t, staying.Expect("OK").OK, "the other community's events are stored")
	}
	var stored int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM events e JOIN communities c ON c.id = e.community_id WHERE c.host = $1 AND e.kind = 1`, otherHost).Scan(&stored))
	require.Equal(t, n, stored)

	// An AUTH whose owner attestation would be recorded meets the fence
	// too, and says so (it answered "could not record the owner
	// attestation; try again").
	agent := relaytest.NewKey(t)
	auth := authWith(t, unauthenticated, agent, attest(t, going.Key, agent.PublicKeyHex(), ""))
	require.False(t, auth.OK)
	require.Equal(t, beingDeleted, auth.Msg)
}

// Over HTTP the same write is answered 410 Gone with the same text, at
// the request's first write (its NIP-98 replay claim) and at the event's
// own. Mutations killed: the bridge answering the fence's rejection by
// its prefix (403) or as an internal error (500 "... try again"); the
// auth claim's fence answered 500 "could not check authorization; try
// again".
func TestFencedWriteOverHTTPIsGone(t *testing.T) {
	t.Parallel()
	for _, table := range []string{"events", "http_auth_replays"} {
		t.Run(table, func(t *testing.T) {
			t.Parallel()
			pool := dbtest.Pool(t)
			r := relaytest.StartOn(t, pool)
			key := relaytest.NewKey(t)
			req := postEventRequest(t, r, key, relaytest.SignEvent(t, key, 1, "late", nil, 0))
			got := acrossQuiescing(t, pool, r.Host, table, func() httpAnswer { return doJSON(req) })
			require.Equal(t, http.StatusGone, got.status, "%v", got.body)
			if table == "events" {
				require.Equal(t, false, got.body["accepted"], "%v", got.body)
				require.Equal(t, beingDeleted, got.body["message"])
			} else {
				require.Equal(t, beingDeleted, got.body["error"])
			}
		})
	}
}

// A webhook call whose run the fence refuses is 410 with the same text,
// not 503 "database unavailable", which a caller retries. Mutation killed:
// the webhook answering the fence 503.
func TestFencedWebhookCallIsGone(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	r := relaytest.StartOn(t, pool)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	ch := createChannel(t, owner, "hooks", false)
	hook, secret := saveWebhookWorkflow(t, owner, ch, "[{id: say, action: send_message, text: hooked}]")
	req, err := http.NewRequest(http.MethodPost, r.HTTPURL+"/hooks/"+hook, strings.NewReader(`{}`))
	require.NoError(t, err)
	req.Header.Set("X-Webhook-Secret", secret)

	got := acrossQuiescing(t, pool, r.Host, "workflow_runs", func() httpAnswer { return doJSON(req) })
	require.Equal(t, http.StatusGone, got.status, "%v", got.body)
	require.Equal(t, beingDeleted, got.body["error"])
}

// A lock wait cut short (55P03, lock_timeout) is not the fence: it is
// still "try again", over WebSocket and HTTP. Mutation killed: mapping
// every lock failure (55P03, or any 55000) as the fence.
func TestLockTimeoutStillSaysTryAgain(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	pool := dbtest.PoolOn(t, url, 0)
	relayPool := dbtest.PoolOn(t, url, 0, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["lock_timeout"] = "200ms" })
	r := relaytest.StartOn(t, relayPool)
	key := relaytest.NewKey(t)
	c := r.Dial(t, "")
	c.Auth(key)
	req := postEventRequest(t, r, key, relaytest.SignEvent(t, key, 1, "over http", nil, 0))

	holdTable(t, pool, "events")
	got := c.Publish(c.Sign(1, "over the socket", nil, 0))
	require.False(t, got.OK)
	require.Equal(t, "error: could not store the event; try again", got.Msg)
	answer := doJSON(req)
	require.NoError(t, answer.err)
	require.Equal(t, http.StatusInternalServerError, answer.status, "%v", answer.body)
	require.Equal(t, "error: could not store the event; try again", answer.body["error"])
}
