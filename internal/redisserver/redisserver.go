// Package redisserver runs a private redis-server on loopback for tests: the
// test wrapper (internal/dbtest/withcluster) starts one per test run, and a
// test that must take Redis away and bring it back starts its own. It only
// drives the binary the Debian redis-server package installs; nothing is
// downloaded, nothing is persisted.
package redisserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/buzzrelay/buzz/internal/localport"
)

// ErrNoRedis means no redis-server binary was found.
var ErrNoRedis = errors.New("redis-server not found on PATH; install it (Debian: apt-get install redis-server)")

// Server is a running private redis-server.
type Server struct {
	bin  string
	port int

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has been waited for
	dir    string
}

// Start runs redis-server on a free loopback port.
func Start(ctx context.Context) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, ErrNoRedis
	}
	s := &Server{bin: bin}
	// A port found free may be taken before redis-server binds it: retry.
	for attempt := 1; ; attempt++ {
		if s.port, err = localport.Free(); err != nil {
			return nil, err
		}
		if err = s.Restart(ctx); err == nil {
			return s, nil
		}
		if attempt == 3 || ctx.Err() != nil {
			return nil, err
		}
	}
}

// URL is the redis:// URL of the server (database 0).
func (s *Server) URL() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", s.port) }

// Addr is host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Pid is the process id of the running redis-server (a test may stop it
// with SIGSTOP to stall it).
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd.Process.Pid
}

// Restart starts the server again on the same port after Kill (a no-op
// while it runs).
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	dir, err := os.MkdirTemp("", "buzz-redis-")
	if err != nil {
		return err
	}
	// No persistence and no unix socket: a test server keeps nothing.
	cmd := exec.Command(s.bin,
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	if err := waitListening(ctx, s.Addr(), exited); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		os.RemoveAll(dir)
		return fmt.Errorf("redis-server on port %d: %w: %s", s.port, err, strings.TrimSpace(out.String()))
	}
	s.cmd, s.exited, s.dir = cmd, exited, dir
	return nil
}

// Kill stops the server abruptly (SIGKILL), as a crash would.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	os.RemoveAll(s.dir)
	s.cmd, s.exited, s.dir = nil, nil, ""
}

// Close stops the server.
func (s *Server) Close() { s.Kill() }

func waitListening(ctx context.Context, addr string, exited <-chan struct{}) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			// Answering PING means it is serving, not only bound.
			_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
			_, werr := conn.Write([]byte("PING\r\n"))
			buf := make([]byte, 7)
			n, rerr := conn.Read(buf)
			conn.Close()
			if werr == nil && rerr == nil && strings.HasPrefix(string(buf[:n]), "+PONG") {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("exited before serving")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("not serving after 15s")
		}
	}
}
