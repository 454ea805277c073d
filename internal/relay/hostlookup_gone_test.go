package relay_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/logtest"
	"github.com/buzzrelay/buzz/internal/relay"
)

// A client that hangs up while its request's Host is being looked up (here
// waiting for a read slot) is no database failure: nothing is logged as an
// error, or every client churning through a busy relay wrote an ERROR
// "resolve community ... context canceled" an operator would page on.
// Mutation checked: the early return for a gone client removed (the ERROR
// is logged).
func TestClientGoneDuringHostLookupLogsNoError(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	logs := &logtest.Buffer{}
	srv := relay.New(config.Default(), pool, slog.New(slog.NewTextHandler(logs, nil)))
	hs := httptest.NewServer(srv.HTTPServer().Handler)
	host := community.NormalizeHost(hs.Listener.Addr().String())
	_, err := db.New(pool).CommunityCreate(t.Context(), host)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})

	// Every read slot taken, as by statements stuck in the database.
	slots := srv.ReadSlots()
	held := 0
	for slots.TryAcquire(1) {
		held++
	}
	defer slots.Release(int64(held))

	for range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, hs.URL+"/", nil)
		require.NoError(t, err)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		deadline := time.Now().Add(time.Minute)
		for !srv.HostLookupRunning(host) {
			require.True(t, time.Now().Before(deadline), "the request never reached the host lookup")
			time.Sleep(time.Millisecond)
		}
		cancel()
		<-done
		for srv.HostLookupRunning(host) {
			require.True(t, time.Now().Before(deadline), "the lookup never ended")
			time.Sleep(time.Millisecond)
		}
	}
	hs.Close() // waits for the handlers
	require.NotContains(t, logs.String(), "level=ERROR", logs.String())
}
