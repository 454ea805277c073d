package relay_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/crossrelay"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/deletion"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// quiesceCommunity takes the community at host through its deletion up to
// quiescing, with the SQL steps the deletion executor runs, and returns the
// claimed request.
func quiesceCommunity(t *testing.T, pool *pgxpool.Pool, host string) db.CommunityDeletionRequest {
	t.Helper()
	ctx := context.Background()
	req, err := deletion.Submit(ctx, pool, nil, host, "ops@example", "test")
	require.NoError(t, err)
	req, err = deletion.Approve(ctx, pool, req.ID, "lead@example", "test")
	require.NoError(t, err)
	q := db.New(pool)
	row, err := q.DeletionRequestClaim(ctx, db.DeletionRequestClaimParams{ID: &req.ID, Owner: "test", LeaseSeconds: 3600})
	require.NoError(t, err)
	require.NoError(t, q.DeletionRequestBeginQuiescing(ctx, db.DeletionRequestBeginQuiescingParams{ID: row.ID, Owner: "test", Generation: row.LeaseGeneration}))
	return row
}

// fenceCommunity takes the community at host through its deletion up to
// the fence.
func fenceCommunity(t *testing.T, pool *pgxpool.Pool, host string) {
	t.Helper()
	row := quiesceCommunity(t, pool, host)
	_, err := db.New(pool).DeletionRequestFence(context.Background(), db.DeletionRequestFenceParams{ID: row.ID, Owner: "test", Generation: row.LeaseGeneration})
	require.NoError(t, err)
}

// requireClosedForDeletion waits for the socket to be closed with 1008
// "community deleted".
func requireClosedForDeletion(t *testing.T, c *relaytest.Client) {
	t.Helper()
	requireClosedWith(t, c, "community deleted")
}

// hostStatus is the HTTP status a plain GET of / on host gets.
func hostStatus(t *testing.T, r *relaytest.Relay, host string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, r.HTTPURL+"/", nil)
	require.NoError(t, err)
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// A community whose deletion fences it loses its live connections on every
// relay of the database at once (no Redis involved), with 1008 "community
// deleted"; another community's connections on the same relays stay up and
// keep working, and a reconnect to the deleted community gets HTTP 404.
// Mutations killed: no trigger announcing the closing (nothing closes
// before the 30 s sweep; the test waits on the announcement only);
// closeCommunity closing every connection of the relay (the other
// community's clients are cut off); a relay not listening (B's client
// stays open).
func TestDeletedCommunityIsClosedOnEveryRelay(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	slowSweep := func(c *config.Config) { c.ClosedCommunitySweep = time.Hour }
	a := relaytest.StartOn(t, pool, slowSweep)
	b := relaytest.StartOn(t, pool, slowSweep)
	const otherHost = "other.example"
	a.AddCommunity(t, otherHost)

	var deleted, kept []*relaytest.Client
	for _, r := range []*relaytest.Relay{a, b} {
		d := r.Dial(t, a.Host)
		d.Auth(nil)
		k := r.Dial(t, otherHost)
		k.Auth(nil)
		for _, c := range []*relaytest.Client{d, k} {
			c.Send("REQ", "live", map[string]any{"kinds": []int{1}, "limit": 0})
			c.Expect("EOSE")
		}
		deleted, kept = append(deleted, d), append(kept, k)
	}
	fenceCommunity(t, pool, a.Host)
	for _, c := range deleted {
		requireClosedForDeletion(t, c)
	}
	for _, r := range []*relaytest.Relay{a, b} {
		require.Equal(t, 1.0, testutil.ToFloat64(r.Server.Metrics().CommunityClosedConns.WithLabelValues("community deleted")))
		require.Equal(t, http.StatusNotFound, hostStatus(t, r, a.Host), "a deleted community's host is not served")
	}
	for _, k := range kept {
		ev := k.Sign(1, "still here", nil, 0)
		k.Send("EVENT", ev)
		require.Equal(t, ev.ID, k.Expect("EVENT").Event.ID, "the other community keeps its live delivery")
		require.True(t, k.Expect("OK").OK, "the other community keeps working")
	}
}

// An announcement that never arrives (the trigger disabled, as if the
// listener was reconnecting when it was sent) is made up for by the sweep.
// Mutation killed: no periodic sweep (the connection stays open).
func TestClosedCommunitySweepCatchesALostAnnouncement(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	r := relaytest.StartOn(t, pool, func(c *config.Config) { c.ClosedCommunitySweep = 200 * time.Millisecond })
	c := r.Dial(t, r.Host)
	c.Auth(nil)
	_, err := pool.Exec(context.Background(), `ALTER TABLE communities DISABLE TRIGGER communities_announce_closed`)
	require.NoError(t, err)
	fenceCommunity(t, pool, r.Host)
	requireClosedForDeletion(t, c)
}

// With Redis, an operator's DisconnectCommunity on the community's control
// channel closes its connections on every relay, and a connection that
// resolved the community before the command is refused by the relay that
// heard it.
// Mutations killed: the bus not subscribed to the control channels (the
// sockets stay open); track not consulting the closed set (the new socket
// stays open, since the database still says active).
func TestDisconnectCommunityOverRedis(t *testing.T) {
	t.Parallel()
	url := dbtest.RedisURL(t)
	pool := dbtest.Pool(t)
	slowSweep := func(c *config.Config) { c.ClosedCommunitySweep = time.Hour }
	a := relaytest.StartOn(t, pool, withRedis(url), slowSweep)
	b := relaytest.StartOn(t, pool, withRedis(url), slowSweep)
	waitRedis(t, "connected", a, b)
	onA, onB := a.Dial(t, a.Host), b.Dial(t, a.Host)
	onA.Auth(nil)
	onB.Auth(nil)

	opts, err := redis.ParseURL(url)
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	require.NoError(t, rdb.Publish(context.Background(), crossrelay.ControlChannel(a.CommunityID), crossrelay.DisconnectCommunity).Err())
	requireClosedForDeletion(t, onA)
	requireClosedForDeletion(t, onB)
	late, err := b.TryDial(a.Host)
	require.NoError(t, err, "the database still says active: the host resolves")
	requireClosedForDeletion(t, late)
}

// requireClosedWith waits for the socket to be closed with 1008 and reason.
func requireClosedWith(t *testing.T, c *relaytest.Client, reason string) {
	t.Helper()
	err := readUntilClosed(c.WS, 60*time.Second)
	require.Equal(t, websocket.StatusPolicyViolation, websocket.CloseStatus(err), "got %v", err)
	var ce websocket.CloseError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, reason, ce.Reason)
}

// Archiving a community closes its open sockets on every relay with 1008
// "community archived" (before, they went on storing and reading events
// for as long as they stayed connected); unarchived, it serves again.
// Mutations killed: no archive trigger (the sockets stay open: the sweep
// is an hour away); an archive refusing the community's later connections
// for good (the socket after unarchive is refused).
func TestArchivedCommunityIsClosedUntilUnarchived(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	slowSweep := func(c *config.Config) { c.ClosedCommunitySweep = time.Hour }
	a := relaytest.StartOn(t, pool, slowSweep)
	b := relaytest.StartOn(t, pool, slowSweep)
	var open []*relaytest.Client
	for _, r := range []*relaytest.Relay{a, b} {
		c := r.Dial(t, a.Host)
		c.Auth(nil)
		c.Send("REQ", "live", map[string]any{"kinds": []int{1}, "limit": 0})
		c.Expect("EOSE")
		open = append(open, c)
	}
	q := db.New(pool)
	_, err := q.CommunityArchive(ctx, db.CommunityArchiveParams{Host: a.Host})
	require.NoError(t, err)
	for _, c := range open {
		requireClosedWith(t, c, "community archived")
	}
	require.Equal(t, 1.0, testutil.ToFloat64(a.Server.Metrics().CommunityClosedConns.WithLabelValues("community archived")))
	require.Equal(t, http.StatusNotFound, hostStatus(t, a, a.Host))

	_, err = q.CommunityUnarchive(ctx, a.Host)
	require.NoError(t, err)
	for _, r := range []*relaytest.Relay{a, b} {
		c := r.Dial(t, a.Host)
		c.Auth(nil)
		ev := c.Sign(1, "back again", nil, 0)
		c.Send("EVENT", ev)
		require.True(t, c.Expect("OK").OK, "an unarchived community serves again")
	}
}

// A deletion closes the community's sockets when it starts quiescing, not
// only at the fence: from then on their stored writes are refused, and
// their ephemeral events (which never reach the database's fence) went on
// reaching other members until the fence, however long that took.
// Mutation killed: the closing trigger firing from fenced on only.
func TestQuiescingCommunityIsClosed(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	r := relaytest.StartOn(t, pool, func(c *config.Config) { c.ClosedCommunitySweep = time.Hour })
	c := r.Dial(t, r.Host)
	c.Auth(nil)
	quiesceCommunity(t, pool, r.Host)
	requireClosedForDeletion(t, c)
}

// The sweep also finds an archive whose announcement was lost.
// Mutation killed: the sweep's query asking for deletions only.
func TestClosedCommunitySweepCatchesALostArchive(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	r := relaytest.StartOn(t, pool, func(c *config.Config) { c.ClosedCommunitySweep = 200 * time.Millisecond })
	c := r.Dial(t, r.Host)
	c.Auth(nil)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `ALTER TABLE communities DISABLE TRIGGER communities_announce_archived`)
	require.NoError(t, err)
	_, err = db.New(pool).CommunityArchive(ctx, db.CommunityArchiveParams{Host: r.Host})
	require.NoError(t, err)
	requireClosedWith(t, c, "community archived")
}
