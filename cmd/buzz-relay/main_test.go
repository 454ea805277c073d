package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/migrate"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/pgcluster"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// listenLoopback binds a free loopback port for a relay under test. The
// listener itself is handed to serve or dev: a port chosen, released and
// bound again later could be taken meanwhile by another test's server,
// whose /ready would then answer for ours.
func listenLoopback(t *testing.T) (net.Listener, int) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return l, l.Addr().(*net.TCPAddr).Port
}

// mustListen binds the metrics address beside an already bound listener.
func mustListen(t *testing.T, cfg config.Config, public net.Listener) addresses {
	t.Helper()
	ls, err := listen(cfg, public)
	require.NoError(t, err)
	return ls
}

// runRelay runs a relay (run calls serve or dev) until the returned stop
// is called or the test ends, and returns once the relay on port answers
// /ready. A relay that exits first fails the test at once with its error,
// and the log passed to run is shown whenever the test fails.
func runRelay(t *testing.T, port int, run func(ctx context.Context, log *slog.Logger) error) (stop func()) {
	t.Helper()
	var logged lockedBuffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, log) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err, "the relay's exit")
			case <-time.After(time.Minute):
				t.Error("the relay did not stop within a minute of its cancel")
			}
		})
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("the relay's log:\n%s", logged.String())
		}
	})

	deadline := time.After(time.Minute)
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case err := <-done:
			done <- err // for stop
			t.Fatalf("the relay exited before it was ready: %v", err)
		case <-deadline:
			t.Fatalf("the relay on port %d was not ready within a minute", port)
		case <-poll.C:
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/ready", port))
			if err != nil {
				continue
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return stop
			}
		}
	}
}

func TestServeRefusesADatabaseThatIsBehind(t *testing.T) {
	t.Parallel()
	cfg := config.Default()
	cfg.MetricsAddr = "127.0.0.1:0" // parallel tests must not share the default metrics port
	cfg.DatabaseURL = dbtest.EmptyURL(t)
	listener, _ := listenLoopback(t)
	err := serve(context.Background(), cfg, quiet, mustListen(t, cfg, listener), noEnv)
	require.ErrorContains(t, err, "run `buzz-relay migrate` first")

	require.NoError(t, runMigrate(context.Background(), cfg, nil))
	listener, port := listenLoopback(t)
	addrs := mustListen(t, cfg, listener)
	runRelay(t, port, func(ctx context.Context, log *slog.Logger) error { return serve(ctx, cfg, log, addrs, noEnv) })()
}

// Going down drops tables with their rows: migrate to a lower version
// only with --destroy-data, so a typo cannot drop events.
// Mutation killed: without the check, "to 1" drops events.
func TestMigrateDownNeedsDestroyData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := config.Default()
	cfg.DatabaseURL = dbtest.EmptyURL(t)
	require.NoError(t, runMigrate(ctx, cfg, []string{"to", "18"}))
	require.NoError(t, runMigrate(ctx, cfg, []string{"to", "19"}), "up needs no flag")
	err := runMigrate(ctx, cfg, []string{"to", "1"})
	require.ErrorContains(t, err, "add --destroy-data")
	require.ErrorContains(t, runMigrate(ctx, cfg, []string{"to", "-5", "--destroy-data"}), "want a version number (0 or more)")
	conn, err := pgx.Connect(ctx, cfg.DatabaseURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	st, err := migrate.CurrentStatus(ctx, conn)
	require.NoError(t, err)
	require.EqualValues(t, 19, st.Current)
	require.NoError(t, runMigrate(ctx, cfg, []string{"to", "18", "--destroy-data"}))
	st, err = migrate.CurrentStatus(ctx, conn)
	require.NoError(t, err)
	require.EqualValues(t, 18, st.Current)
}

// A mistyped migrate command line is a usage error (exit 2), checked
// before connecting: it is not reported as a database error, and it never
// runs a migration (before, "migrate up now" and "migrate status x" ran
// up and status).
// Mutation killed: the arguments checked after connecting (the
// unreachable database's error is returned instead).
func TestMigrateArgumentsAreCheckedFirst(t *testing.T) {
	t.Parallel()
	cfg := config.Default()
	cfg.DatabaseURL = "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"
	for _, args := range [][]string{{"bogus"}, {"up", "now"}, {"status", "x"}, {"to"}, {"to", "abc"}, {"to", "-1"}, {"to", "5", "--force"}} {
		var u usageError
		require.ErrorAs(t, runMigrate(context.Background(), cfg, args), &u, "migrate %v", args)
	}
	require.NotErrorAs(t, runMigrate(context.Background(), cfg, []string{"status"}), new(usageError))
}

// The dev relay keeps its private cluster across restarts: an event
// published before a stop is still there after the next start, and so is
// a blob uploaded to its media store under the data directory.
// Mutation killed (media): dev not defaulting BUZZ_MEDIA_DIR to
// <data dir>/media (the upload answers 404).
func TestDevRelaySurvivesRestart(t *testing.T) {
	t.Parallel()
	dataDir, err := os.MkdirTemp("", "buzz-dev-test-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dataDir, 0o755)) // the postgres user must reach it when we are root
	t.Cleanup(func() { os.RemoveAll(dataDir) })
	opts := devOptions{DataDir: dataDir} // PGPort 0: the cluster picks a free port

	// Each start listens on a new port; the relay URL, and so the
	// community's host, stays the first one.
	_, firstPort := listenLoopback(t)
	cfg := config.Default()
	cfg.MetricsAddr = "127.0.0.1:0"
	cfg.RelayURL = fmt.Sprintf("ws://localhost:%d", firstPort)
	relay := &relaytest.Relay{Host: fmt.Sprintf("localhost:%d", firstPort)}
	start := func() (stop func()) {
		listener, port := listenLoopback(t)
		relay.URL = fmt.Sprintf("ws://127.0.0.1:%d", port)
		relay.HTTPURL = fmt.Sprintf("http://127.0.0.1:%d", port)
		return runRelay(t, port, func(ctx context.Context, log *slog.Logger) error {
			return dev(ctx, cfg, log, devOptions{DataDir: opts.DataDir, PGPort: opts.PGPort, Listener: listener}, noEnv)
		})
	}

	stop := start()
	c := relay.Dial(t, "")
	c.Auth(nil)
	ev := c.Sign(1, "still here after a restart", nil, 0)
	require.True(t, c.Publish(ev).OK)
	c.WS.CloseNow()
	blob := []byte("a dev upload survives a restart")
	sum := sha256.Sum256(blob)
	sha := hex.EncodeToString(sum[:])
	auth := relaytest.SignEvent(t, relaytest.NewKey(t), 24242, "upload", nostr.Tags{
		{"t", "upload"}, {"x", sha}, {"expiration", strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)},
	}, 0)
	status, _ := devMedia(t, relay, http.MethodPut, "/media/upload", auth, blob)
	require.Equal(t, http.StatusOK, status)
	_, err = os.Stat(filepath.Join(dataDir, "media", sha+".txt"))
	require.NoError(t, err, "the blob is under the data directory")
	stop()

	start()
	c = relay.Dial(t, "")
	c.Auth(nil)
	got := c.Req("again", map[string]any{"ids": []string{ev.ID}})
	require.Len(t, got, 1)
	require.Equal(t, ev.Content, got[0].Content)
	status, body := devMedia(t, relay, http.MethodGet, "/media/"+sha, nil, nil)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, blob, body)
}

// The dev relay logs its private database's URL, which buzz-admin and the
// psql runbooks take as BUZZ_DATABASE_URL, and the URL reaches the
// relay's own database.
// Mutation killed: the log line removed (an operator of `make run` had no
// way to learn the URL but reading pgcluster's source).
func TestDevRelayLogsItsDatabaseURL(t *testing.T) {
	t.Parallel()
	listener, port := listenLoopback(t)
	cfg := config.Default()
	cfg.MetricsAddr = "127.0.0.1:0"
	cfg.RelayURL = fmt.Sprintf("ws://localhost:%d", port)
	var logs lockedBuffer
	// Made before the relay runs, so its removal (a cleanup) comes after the
	// relay stopped its PostgreSQL: removed first, the server outlived the test.
	dataDir := newDevDataDir(t)
	runRelay(t, port, func(ctx context.Context, _ *slog.Logger) error {
		return dev(ctx, cfg, slog.New(slog.NewJSONHandler(&logs, nil)), devOptions{DataDir: dataDir, Listener: listener}, noEnv)
	})
	url := logs.attr(t, "private PostgreSQL ready", "database_url")
	conn, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var hosts int
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT count(*) FROM communities WHERE host = $1", cfg.RelayHost()).Scan(&hosts))
	require.Equal(t, 1, hosts, "the logged URL names the database the relay seeded")
}

// devMedia sends one media request to the dev relay's community.
func devMedia(t *testing.T, relay *relaytest.Relay, method, path string, auth *nostr.Event, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, relay.HTTPURL+path, bytes.NewReader(body))
	require.NoError(t, err)
	req.Host = relay.Host
	if auth != nil {
		raw, err := auth.MarshalJSON()
		require.NoError(t, err)
		req.Header.Set("Authorization", "Nostr "+base64.StdEncoding.EncodeToString(raw))
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, out
}

// newDevDataDir is a data directory the postgres user can reach.
func newDevDataDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "buzz-dev-test-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o755))
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// A second dev relay, started on the first one's data directory and port,
// says who is running there and leaves the first relay's database alone.
// Without the data-directory lock and the listen-first order, the second
// instance fails to bind only after adopting the cluster, and stops it on
// its way out: the first relay's /ready turns 503.
func TestSecondDevRelayLeavesTheFirstOneRunning(t *testing.T) {
	t.Parallel()
	dataDir := newDevDataDir(t)
	opts := devOptions{DataDir: dataDir} // PGPort 0: the cluster picks a free port
	listener, port := listenLoopback(t)
	cfg := config.Default()
	cfg.MetricsAddr = "127.0.0.1:0" // parallel tests must not share the default metrics port
	cfg.RelayURL = fmt.Sprintf("ws://localhost:%d", port)
	cfg.ListenAddr = fmt.Sprintf("127.0.0.1:%d", port)

	first := opts
	first.Listener = listener
	runRelay(t, port, func(ctx context.Context, log *slog.Logger) error { return dev(ctx, cfg, log, first, noEnv) })

	err := dev(context.Background(), cfg, quiet, opts, noEnv)
	require.ErrorContains(t, err, "a dev relay is already running on data directory")
	require.ErrorContains(t, err, fmt.Sprintf("pid %d, listening on %s", os.Getpid(), cfg.ListenAddr))

	// Another data directory, same port: refused before any cluster exists.
	otherDir := newDevDataDir(t)
	err = dev(context.Background(), cfg, quiet, devOptions{DataDir: otherDir}, noEnv)
	require.ErrorContains(t, err, "listen on "+cfg.ListenAddr)
	_, statErr := os.Stat(filepath.Join(otherDir, "postgres"))
	require.True(t, os.IsNotExist(statErr), "no cluster may be created when the port is taken")

	// Another data directory and port, but a taken metrics address: also
	// refused before any cluster exists.
	taken, _ := listenLoopback(t)
	other := cfg
	other.MetricsAddr = taken.Addr().String()
	otherPublic, _ := listenLoopback(t)
	err = dev(context.Background(), other, quiet, devOptions{DataDir: otherDir, Listener: otherPublic}, noEnv)
	require.ErrorContains(t, err, "listen on BUZZ_METRICS_ADDR "+other.MetricsAddr)
	_, statErr = os.Stat(filepath.Join(otherDir, "postgres"))
	require.True(t, os.IsNotExist(statErr), "no cluster may be created when the metrics port is taken")

	// The first relay still has its database.
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/ready", port))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	relay := &relaytest.Relay{URL: fmt.Sprintf("ws://127.0.0.1:%d", port), Host: fmt.Sprintf("localhost:%d", port)}
	c := relay.Dial(t, "")
	c.Auth(nil)
	require.True(t, c.Publish(c.Sign(1, "first relay still writes", nil, 0)).OK)
}

// A server running on the dev data directory that no dev relay started (a
// developer's own pg_ctl, another tool) is neither taken over nor stopped:
// dev refuses to start, names the server and gives the command that stops
// it, and the server keeps running. One the dev relay started itself it
// stops on exit.
// Mutations killed: adopting any running server (dev starts, and the
// error is missing), or stopping a server it refused.
func TestDevRelayRefusesAServerItDidNotStart(t *testing.T) {
	t.Parallel()
	dataDir := newDevDataDir(t)
	cluster, err := pgcluster.Start(context.Background(), pgcluster.Options{DataDir: filepath.Join(dataDir, "postgres")})
	require.NoError(t, err)
	pgPort := cluster.Port()
	t.Cleanup(func() { _ = cluster.Stop() })
	require.False(t, cluster.Adopted())
	server, err := cluster.Postmaster()
	require.NoError(t, err)

	cfg := config.Default()
	cfg.MetricsAddr = "127.0.0.1:0" // parallel tests must not share the default metrics port
	listener, port := listenLoopback(t)
	cfg.RelayURL = fmt.Sprintf("ws://localhost:%d", port)
	// Bounded: a dev relay that wrongly adopted the server would serve until cancelled.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = dev(ctx, cfg, quiet, devOptions{DataDir: dataDir, PGPort: pgPort, Listener: listener}, noEnv)
	require.ErrorContains(t, err, fmt.Sprintf("a PostgreSQL that no dev relay started is already running on %s (pid %d, port %d)",
		cluster.DataDir(), server.PID, pgPort))
	require.ErrorContains(t, err, "stop it with `"+cluster.StopCommand()+"`")

	conn, err := pgx.Connect(context.Background(), cluster.URL("postgres"))
	require.NoError(t, err, "the server someone else started must still be running")
	conn.Close(context.Background())

	// Stopped by hand as told: the dev relay starts its own and stops it on exit.
	require.NoError(t, cluster.Stop())
	listener, port = listenLoopback(t)
	runRelay(t, port, func(ctx context.Context, log *slog.Logger) error {
		return dev(ctx, cfg, log, devOptions{DataDir: dataDir, PGPort: pgPort, Listener: listener}, noEnv)
	})()
	_, err = pgx.Connect(context.Background(), cluster.URL("postgres"))
	require.Error(t, err, "the dev relay stops the cluster it started")
}

// A dev relay killed with SIGKILL (kill -9 of `make run`) cannot stop its
// PostgreSQL, which pg_ctl detached: the server keeps running on the data
// directory. The next dev relay finds the server its predecessor recorded,
// adopts it, says so, and stops it on exit like one it started.
// Mutations killed: refusing every server found running (the second start
// fails), or adopting it without stopping it on exit (the orphan
// outlives the second relay too).
func TestDevRelayAdoptsTheServerOfAKilledDevRelay(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	dataDir := newDevDataDir(t)
	free, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	pgPort := free.Addr().(*net.TCPAddr).Port
	require.NoError(t, free.Close())
	_, relayPort := listenLoopback(t) // the relay URL's port: the community's host, for both relays
	relayURL := fmt.Sprintf("ws://localhost:%d", relayPort)

	first := &relayProcess{name: "killed dev relay", logs: &lockedBuffer{}, exited: make(chan struct{})}
	first.cmd = exec.Command(bin, "dev")
	first.cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"BUZZ_DEV_DATA_DIR=" + dataDir,
		"BUZZ_DEV_PG_PORT=" + strconv.Itoa(pgPort),
		"BUZZ_LISTEN_ADDR=127.0.0.1:0",
		"BUZZ_METRICS_ADDR=127.0.0.1:0",
		"BUZZ_RELAY_URL=" + relayURL,
	}
	first.cmd.Stdout, first.cmd.Stderr = first.logs, first.logs
	killWithParent(first.cmd)
	require.NoError(t, first.cmd.Start())
	go func() {
		_ = first.cmd.Wait()
		close(first.exited)
	}()
	t.Cleanup(func() {
		first.kill()
		if t.Failed() {
			t.Logf("log of the killed dev relay:\n%s", first.logs.String())
		}
	})
	adminURL := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", pgPort)
	t.Cleanup(func() { // a failed test leaves no server running
		if t.Failed() {
			if c, err := pgcluster.Start(context.Background(), pgcluster.Options{DataDir: filepath.Join(dataDir, "postgres")}); err == nil {
				_ = c.Kill()
			}
		}
	})
	require.Eventually(t, func() bool {
		addr, ok := first.logs.find("relay listening", "addr")
		if !ok {
			return false
		}
		resp, err := http.Get("http://" + addr + "/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 2*time.Minute, 20*time.Millisecond, "the first dev relay never became ready")

	first.kill() // SIGKILL: no deferred stop runs
	conn, err := pgx.Connect(context.Background(), adminURL)
	require.NoError(t, err, "the killed relay's server is still running (an orphan)")
	conn.Close(context.Background())

	listener, port := listenLoopback(t)
	cfg := config.Default()
	cfg.MetricsAddr = "127.0.0.1:0"
	cfg.RelayURL = relayURL
	var logs lockedBuffer
	runRelay(t, port, func(ctx context.Context, _ *slog.Logger) error {
		return dev(ctx, cfg, slog.New(slog.NewJSONHandler(&logs, nil)), devOptions{DataDir: dataDir, PGPort: pgPort, Listener: listener}, noEnv)
	})()
	adopted := logs.attr(t, "adopted the PostgreSQL a dev relay left running when it was killed; stopping it on exit like one this relay started", "dir")
	require.Equal(t, filepath.Join(dataDir, "postgres"), adopted)
	_, err = pgx.Connect(context.Background(), adminURL)
	require.Error(t, err, "the adopted orphan is stopped when the relay that adopted it exits")
	_, err = os.Stat(filepath.Join(dataDir, "buzz-relay-dev.postgres.server"))
	require.True(t, os.IsNotExist(err), "a server stopped is no longer recorded")
}

// BUZZ_DEV_REPLICA=1 gives the dev relay a streaming standby of its
// private cluster, and reads route to it: /ready reports the reader
// streaming.
func TestDevRelayWithAStandby(t *testing.T) {
	t.Parallel()
	dataDir := newDevDataDir(t)
	opts, err := devOptionsFromEnv(func(k string) string {
		return map[string]string{"BUZZ_DEV_REPLICA": "1"}[k]
	})
	require.NoError(t, err)
	require.True(t, opts.Replica)
	opts.DataDir, opts.PGPort, opts.ReplicaPort = dataDir, 0, 0
	listener, port := listenLoopback(t)
	opts.Listener = listener
	cfg := config.Default()
	cfg.MetricsAddr = "127.0.0.1:0"
	cfg.RelayURL = fmt.Sprintf("ws://localhost:%d", port)
	runRelay(t, port, func(ctx context.Context, log *slog.Logger) error { return dev(ctx, cfg, log, opts, noEnv) })
	require.Eventually(t, func() bool {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/ready", port))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var body map[string]string
		return json.NewDecoder(resp.Body).Decode(&body) == nil && body["reader"] == "streaming"
	}, time.Minute, 50*time.Millisecond)
}

// The migrator's session is named buzz-migrate: an operator whose
// deployment waits on a migration's lock finds the holder by name.
// Mutation killed: connectMigrator without pgsession.Name (the name is "").
func TestMigratorSessionIsNamed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := connectMigrator(ctx, dbtest.URL(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.Equal(t, "buzz-migrate", dbtest.SessionName(t, conn))
}
