package relay_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// /ready requests that arrive while a readiness check runs share it:
// an outsider asking for /ready back to back no longer runs a check (a
// pooled connection for a ping and a catalog query, an S3 request, a
// replica query) per request. 40 connections doing so held the pool
// connections writes need and tripled publish latency. Here the check
// waits for a connection of an exhausted pool while 20 requests arrive:
// one check answers them all.
// Mutation killed: serveReady starting its own check for every request
// (no request joins a running check).
func TestConcurrentReadyRequestsShareOneCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbtest.URL(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	r := relaytest.StartOn(t, pool)
	r.Server.SetReadyTimeout(time.Minute)

	// Every pooled connection taken: the check's ping waits for one.
	var held []*pgxpool.Conn
	for range pool.Config().MaxConns {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		held = append(held, c)
	}
	releaseAll := func() {
		for _, c := range held {
			c.Release()
		}
		held = nil
	}
	t.Cleanup(releaseAll)
	checksBefore, _ := r.Server.ReadyChecks()

	const requests = 20
	statuses := make(chan int, requests)
	for range requests {
		go func() {
			resp, err := bridgeHTTP.Get(r.HTTPURL + "/ready")
			if err != nil {
				statuses <- 0
				return
			}
			resp.Body.Close()
			statuses <- resp.StatusCode
		}()
	}
	require.Eventually(t, func() bool {
		_, joined := r.Server.ReadyChecks()
		return joined == requests-1
	}, time.Minute, 10*time.Millisecond, "the requests did not join the running check")
	releaseAll()
	for range requests {
		require.Equal(t, http.StatusOK, <-statuses)
	}
	checks, _ := r.Server.ReadyChecks()
	require.Equal(t, int64(1), checks-checksBefore)
}

// A readiness check whose catalog query fails (here the function it calls
// is renamed away; a backend terminated between the ping and the query
// fails it alike) answers 503 without the server's message: /ready is
// public, and it carried PostgreSQL's own text ("FATAL: terminating
// connection due to administrator command (SQLSTATE 57P01)", seen with
// every relay backend terminated under load) under a status that blamed a
// missing write fence. The cause goes to the log.
// Mutation killed: the check's error shown as the answer's detail under
// "community write fence incomplete".
func TestReadyDoesNotShowAFailedCatalogCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := relaytest.Start(t)
	_, err := r.Pool.Exec(ctx, `ALTER FUNCTION community_deletion_catalog_problems() RENAME TO catalog_problems_renamed_away`)
	require.NoError(t, err)
	resp, err := bridgeHTTP.Get(r.HTTPURL + "/ready")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.JSONEq(t, `{"status":"readiness check failed"}`, string(body))
}
