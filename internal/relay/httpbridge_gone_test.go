package relay_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptrace"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A client that gives up on a bridge request while its NIP-98 claim waits
// for a read slot (every slot busy, as under load) is nobody's fault: the
// relay has no one to answer and nothing went wrong. It wrote an ERROR
// "http auth failed ... context canceled" for each such request, so a busy
// relay's impatient clients, or one client sending and abandoning requests
// in a loop, filled the log with lines that read as a fault of the relay.
// The slots are taken once the relay has looked up the host and asks for
// the body (Expect: 100-continue), and the client leaves once its body is
// sent, so the claim is what waits.
// Mutation killed: authenticatePrincipal logging a failed claim without
// checking whether the client is still there (the ERROR line appears).
func TestHTTPBridgeClaimAbandonedByItsClientIsNotLoggedAsAFailure(t *testing.T) {
	t.Parallel()
	hs, logs, srv := relayLoggingTo(t, dbtest.PoolOn(t, dbtest.URL(t), 8)) // readSlots slots
	key := relaytest.NewKey(t)
	body, err := json.Marshal(relaytest.SignEvent(t, key, 1, "abandoned at its claim", nil, 0))
	require.NoError(t, err)
	leaveWhileTheClaimWaitsForAReadSlot(t, srv, signedPost(t, hs, key, "/events", body))
	require.Eventually(t, func() bool { return srv.BridgeRequestsAnswering() == 0 },
		relaytest.Patience, time.Millisecond, "the request ended")
	// Refused at its claim (an "error"), not at its body ("invalid").
	require.Equal(t, 1.0, testutil.ToFloat64(srv.Metrics().EventsRejected.WithLabelValues("error")))
	require.NotContains(t, logs.String(), "http auth failed", logs.String())
}

// A client that gives up while its claim's statement runs is not the case
// above: the statement may be stuck behind a lock (a migration's, a
// session left open), every client then gives up in turn, and with each
// such request quiet the relay said nothing at all of a claim that could
// not run. Only a claim that never ran (its client left while it waited
// for a read slot) is quiet. Another session holds a lock on the claims'
// table for real; the client leaves once the relay's claim waits on it.
// Mutation killed: any claim whose client left kept quiet (no "http auth
// failed" line).
func TestHTTPBridgeClaimCutOffByItsClientLeavingIsStillLogged(t *testing.T) {
	t.Parallel()
	pool := dbtest.PoolOn(t, dbtest.URL(t), 8)
	hs, logs, srv := relayLoggingTo(t, pool)
	key := relaytest.NewKey(t)
	body, err := json.Marshal(relaytest.SignEvent(t, key, 1, "cut off at its claim", nil, 0))
	require.NoError(t, err)
	locker, err := pool.Begin(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = locker.Rollback(context.Background()) })
	_, err = locker.Exec(t.Context(), "LOCK TABLE http_auth_replays IN SHARE MODE") // inserts wait
	require.NoError(t, err)

	ctx, leave := context.WithCancel(t.Context())
	defer leave()
	go func() {
		defer leave()
		for ctx.Err() == nil {
			var waiting int
			err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
				AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO http_auth_replays%'`).Scan(&waiting)
			if err != nil || waiting > 0 {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	resp, err := http.DefaultClient.Do(signedPost(t, hs, key, "/events", body).WithContext(ctx))
	if err == nil {
		resp.Body.Close()
	}
	require.ErrorIs(t, err, context.Canceled, "the client left before its answer")
	require.Eventually(t, func() bool { return srv.BridgeRequestsAnswering() == 0 },
		relaytest.Patience, time.Millisecond, "the request ended")
	require.Contains(t, logs.String(), `msg="http auth failed"`, logs.String())
}

// The same for a media upload: its client leaving while the upload's
// NIP-98 claim waits for a read slot wrote an ERROR "media auth failed ...
// context canceled" for each such upload.
// Mutation killed: mediaUnauthorized logging a failed claim without
// checking whether the client is still there.
func TestMediaClaimAbandonedByItsClientIsNotLoggedAsAFailure(t *testing.T) {
	t.Parallel()
	hs, logs, srv := relayLoggingTo(t, dbtest.PoolOn(t, dbtest.URL(t), 8), relay.WithMedia(media.NewService(mediaStores["fs"](t),
		media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)))
	key := relaytest.NewKey(t)
	req := signedUpload(t, hs, key, pngBlob(t, 700))
	leaveWhileTheClaimWaitsForAReadSlot(t, srv, req)
	require.Eventually(t, func() bool { return srv.UploadsReceiving() == 0 },
		relaytest.Patience, time.Millisecond, "the upload ended")
	// Refused at its claim (500), not at its body.
	require.Equal(t, 1.0, testutil.ToFloat64(srv.Metrics().MediaRequests.WithLabelValues("upload", "500")))
	require.NotContains(t, logs.String(), "media auth failed", logs.String())
}

// leaveWhileTheClaimWaitsForAReadSlot sends req and gives up on it once its
// body is sent, with every read slot of srv held from the moment the relay
// asks for the body (Expect: 100-continue, after its host lookup), so that
// the request's NIP-98 claim is what waits when its client leaves.
func leaveWhileTheClaimWaitsForAReadSlot(t *testing.T, srv *relay.Server, req *http.Request) {
	t.Helper()
	req.Header.Set("Expect", "100-continue")
	ctx, leave := context.WithCancel(t.Context())
	defer leave()
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		Got100Continue: func() { holdReadSlots(t, srv.ReadSlots(), readSlots) },
		WroteRequest:   func(httptrace.WroteRequestInfo) { leave() },
	}))
	client := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: time.Minute}}
	resp, err := client.Do(req)
	if err == nil {
		resp.Body.Close()
	}
	require.ErrorIs(t, err, context.Canceled, "the client left before its answer")
}
