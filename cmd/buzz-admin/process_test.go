package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
)

// These tests run the real buzz-admin binary, as an operator's shell does.

var (
	buildOnce sync.Once
	binaryDir string // removed by TestMain
	binary    string
	buildErr  error
	buildOut  []byte
)

// adminBinary compiles this command once per test binary. It is built
// with -race when the test is, so the build reuses the packages the test
// binary was compiled from and only links.
func adminBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binaryDir, buildErr = os.MkdirTemp("", "buzz-admin-test")
		if buildErr != nil {
			return
		}
		binary = filepath.Join(binaryDir, "buzz-admin")
		args := []string{"build", "-o", binary}
		if raceEnabled {
			args = append(args, "-race")
		}
		buildOut, buildErr = exec.Command("go", append(args, ".")...).CombinedOutput()
	})
	require.NoError(t, buildErr, "go build: %s", buildOut)
	return binary
}

// adminProcess is one started buzz-admin; the test's end kills it if it
// is still running.
type adminProcess struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	exited         chan struct{}
}

func startAdmin(t *testing.T, env []string, args ...string) *adminProcess {
	t.Helper()
	p := &adminProcess{cmd: exec.Command(adminBinary(t), args...), exited: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	require.NoError(t, p.cmd.Start())
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// exitCode waits for the process, generously bounded: a loaded 2-core box
// under -race takes seconds where an idle one takes milliseconds.
func (p *adminProcess) exitCode(t *testing.T, why string) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(90 * time.Second):
		t.Fatalf("buzz-admin still running after 90s: %s", why)
	}
	return p.cmd.ProcessState.ExitCode() // -1: killed by a signal
}

// silentDatabase listens and accepts but never answers, as a database
// host behind a dropped route or a hung server looks to a client: no
// refusal, no reply, so only the client's own bound ends the attempt.
// accepted gets a value for each connection accepted.
func silentDatabase(t *testing.T) (url string, accepted <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	acceptedConns := make(chan struct{}, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			select {
			case acceptedConns <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return "postgres://admin@" + ln.Addr().String() + "/buzz?sslmode=disable", acceptedConns
}

// A database host that never answers is an error within the connect
// timeout, the default's included, for a command on one connection and
// for one on a pool (deletions), instead of a hang.
// Mutations killed: no ConnectTimeout set (each case hangs until the bound
// above); the default or the pool's timeout left out (that case hangs).
func TestAnUnansweringDatabaseFailsWithinTheConnectTimeout(t *testing.T) {
	t.Parallel()
	url, _ := silentDatabase(t)
	for _, c := range []struct {
		name, timeout string
		args          []string
		says          string
	}{
		{"one connection", "1s", []string{"communities", "list"}, "no answer within 1s"},
		{"a pool", "1s", []string{"deletions", "list"}, "timeout"},
		{"the default", "", []string{"listeners", "list"}, "no answer within 10s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			env := []string{"BUZZ_DATABASE_URL=" + url}
			if c.timeout != "" {
				env = append(env, "BUZZ_ADMIN_CONNECT_TIMEOUT="+c.timeout)
			}
			p := startAdmin(t, env, c.args...)
			require.Equal(t, 1, p.exitCode(t, "connecting to a database that never answers"), "stderr: %s", p.stderr.String())
			require.Contains(t, p.stderr.String(), c.says)
		})
	}
}

// A bad BUZZ_ADMIN_CONNECT_TIMEOUT is said as such, before any connection.
func TestABadConnectTimeoutIsSaid(t *testing.T) {
	t.Parallel()
	url, _ := silentDatabase(t)
	p := startAdmin(t, []string{"BUZZ_DATABASE_URL=" + url, "BUZZ_ADMIN_CONNECT_TIMEOUT=ten"}, "communities", "list")
	require.Equal(t, 1, p.exitCode(t, "a bad setting"))
	require.Contains(t, p.stderr.String(), "BUZZ_ADMIN_CONNECT_TIMEOUT")
}

// SIGINT or SIGTERM while a statement waits (here for a lock the test
// holds) cancels that statement on the server: the process exits 130 or
// 143 with a message saying so, its backend stops waiting while the lock
// is still held, and nothing is committed once the lock is released. The
// same signal while connecting to a host that never answers ends the
// attempt at once, long before its timeout.
// Mutations killed: main on context.Background (the signal kills the
// process, its INSERT goes on waiting and commits after it is gone); the
// signal caught but the context not cancelled (the process never exits).
func TestASignalCancelsTheCommandAndItsStatement(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		sig  syscall.Signal
		code int
		says string
	}{{syscall.SIGINT, 130, "interrupted by SIGINT"}, {syscall.SIGTERM, 143, "interrupted by SIGTERM"}} {
		t.Run(c.says, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			url := dbtest.URL(t)
			conn, err := pgx.Connect(ctx, url)
			require.NoError(t, err)
			defer conn.Close(ctx)
			// Watched from another session: one in a transaction sees
			// pg_stat_activity as it was at its first look.
			watch, err := pgx.Connect(ctx, url)
			require.NoError(t, err)
			defer watch.Close(ctx)
			lock, err := conn.Begin(ctx)
			require.NoError(t, err)
			_, err = lock.Exec(ctx, `LOCK TABLE communities IN ACCESS EXCLUSIVE MODE`)
			require.NoError(t, err)

			p := startAdmin(t, []string{"BUZZ_DATABASE_URL=" + url}, "communities", "create", "signal.example")
			waiting := func() bool {
				var n int
				require.NoError(t, watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE datname = current_database() AND pid <> pg_backend_pid()
					  AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO communities%'`).Scan(&n))
				return n > 0
			}
			deadline := time.Now().Add(90 * time.Second)
			for !waiting() {
				select {
				case <-p.exited:
					t.Fatalf("buzz-admin exited before its INSERT waited: %s", p.stderr.String())
				default:
				}
				require.True(t, time.Now().Before(deadline), "buzz-admin's INSERT never waited for the lock")
				time.Sleep(10 * time.Millisecond)
			}

			require.NoError(t, p.cmd.Process.Signal(c.sig))
			require.Equal(t, c.code, p.exitCode(t, "signalled"), "stderr: %s", p.stderr.String())
			require.Contains(t, p.stderr.String(), c.says)
			deadline = time.Now().Add(30 * time.Second)
			for waiting() {
				require.True(t, time.Now().Before(deadline), "the INSERT still waits after buzz-admin exited")
				time.Sleep(10 * time.Millisecond)
			}
			require.NoError(t, lock.Rollback(ctx))
			var created int
			require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM communities WHERE host = 'signal.example'`).Scan(&created))
			require.Zero(t, created, "the cancelled command created the community")
		})
	}
	t.Run("while connecting", func(t *testing.T) {
		t.Parallel()
		url, accepted := silentDatabase(t)
		p := startAdmin(t, []string{"BUZZ_DATABASE_URL=" + url, "BUZZ_ADMIN_CONNECT_TIMEOUT=1h"}, "communities", "list")
		// Connecting once the listener has accepted it, its signal handler
		// installed (a signal before that would kill it: -1).
		select {
		case <-accepted:
		case <-time.After(90 * time.Second):
			t.Fatal("buzz-admin never connected")
		}
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
		require.Equal(t, 130, p.exitCode(t, "signalled while connecting"), "stderr: %s", p.stderr.String())
		require.Contains(t, p.stderr.String(), "interrupted by SIGINT")
	})
}
