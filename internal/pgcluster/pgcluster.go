// Package pgcluster runs a private PostgreSQL cluster owned by this project:
// the dev relay (`buzz-relay dev`) keeps one under .data/, and the test
// harness (internal/dbtest) starts one per test run. It only drives the
// server binaries that the PostgreSQL package installs; nothing is downloaded.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/buzzrelay/buzz/internal/localport"
)

// ErrNoPostgres means no PostgreSQL server binaries were found.
var ErrNoPostgres = errors.New("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH or under /usr/lib/postgresql/*/bin; " +
	"install them (Debian: apt-get install postgresql) or set BUZZ_DATABASE_URL to an existing database")

// Options describe a cluster.
type Options struct {
	// DataDir holds the cluster; it is created by initdb when empty.
	DataDir string
	// Port on 127.0.0.1; 0 picks a free one.
	Port int
	// Ephemeral trades durability for speed (fsync off): right for tests,
	// wrong for a dev cluster whose data should survive a crash.
	Ephemeral bool
	// Settings are extra postgresql.conf lines, written once at initdb time.
	Settings map[string]string
	// StandbyOf, when set, is the 127.0.0.1 port of a primary: an empty
	// DataDir becomes a streaming hot standby of it (pg_basebackup -R)
	// instead of a new cluster.
	StandbyOf int
	// StandbySlot, with StandbyOf, names a physical replication slot the
	// copy creates on the primary, so the primary keeps every WAL segment
	// until the standby has it: without one a standby that falls behind a
	// busy primary (a test run creates and drops hundreds of databases) finds
	// the segment it needs recycled and stops replaying for good. A slot
	// whose standby is gone keeps WAL forever, so only throwaway primaries
	// get one.
	StandbySlot string
}

// Cluster is a running private cluster.
type Cluster struct {
	binDir   string
	dataDir  string
	port     int
	runAs    *syscall.Credential // non-nil when we are root and must drop to the postgres user
	tempRoot string              // set by StartTemp: removed on Close
	adopted  bool                // already running before Start: somebody else's to stop
}

// FindBinaries returns the directory that holds initdb, pg_ctl and postgres.
func FindBinaries() (string, error) {
	var candidates []string
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			candidates = append(candidates, filepath.Dir(real))
		}
		candidates = append(candidates, filepath.Dir(p))
	}
	installed, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(installed, func(i, j int) bool { return versionOf(installed[i]) > versionOf(installed[j]) })
	candidates = append(candidates, installed...)
	for _, dir := range candidates {
		if hasExecutables(dir, "initdb", "pg_ctl", "postgres") {
			return dir, nil
		}
	}
	return "", ErrNoPostgres
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func hasExecutables(dir string, names ...string) bool {
	for _, name := range names {
		info, err := os.Stat(filepath.Join(dir, name))
		if err != nil || info.IsDir() || info.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// Start initializes the cluster if DataDir is empty, then starts it (or
// adopts it when it is already running from an earlier start).
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	binDir, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	c := &Cluster{binDir: binDir, dataDir: opts.DataDir, port: opts.Port}
	if c.dataDir, err = filepath.Abs(opts.DataDir); err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root.
		if c.runAs, err = postgresUser(); err != nil {
			return nil, err
		}
	}
	// Parents stay traversable: the postgres user must reach the data directory.
	if err := os.MkdirAll(filepath.Dir(c.dataDir), 0o755); err != nil {
		return nil, err
	}
	if err := os.Mkdir(c.dataDir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	if err := c.chown(c.dataDir); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		if opts.StandbyOf != 0 {
			err = c.basebackup(ctx, opts)
		} else {
			err = c.initdb(ctx, opts)
		}
		if err != nil {
			return nil, err
		}
	}
	if port, running := c.runningPort(); running {
		c.port = port
		c.adopted = true
		return c, nil
	}
	if c.port != 0 {
		if err := c.start(ctx); err != nil {
			return nil, err
		}
		return c, nil
	}
	// A port found free may be taken by another process before the
	// postmaster binds it (parallel test processes start clusters and
	// servers all the time): pick another and try again.
	for attempt := 1; ; attempt++ {
		if c.port, err = pickPort(); err != nil {
			return nil, err
		}
		if err = c.start(ctx); err == nil {
			return c, nil
		}
		if attempt == 3 || ctx.Err() != nil {
			return nil, err
		}
	}
}

func postgresUser() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, so PostgreSQL must run as the 'postgres' user, which does not exist (install the postgresql package): %w", err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func (c *Cluster) chown(path string) error {
	if c.runAs == nil {
		return nil
	}
	return os.Chown(path, int(c.runAs.Uid), int(c.runAs.Gid))
}

func (c *Cluster) initdb(ctx context.Context, opts Options) error {
	args := []string{"-D", c.dataDir, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C"}
	if opts.Ephemeral {
		args = append(args, "--no-sync")
	}
	if err := c.run(ctx, "initdb", args...); err != nil {
		return err
	}
	settings := map[string]string{
		"listen_addresses":        "'127.0.0.1'",
		"unix_socket_directories": "''",
		"max_connections":         "200",
		"shared_buffers":          "'256MB'",
		"log_min_messages":        "warning",
		"logging_collector":       "off",
	}
	if opts.Ephemeral {
		for k, v := range map[string]string{"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"} {
			settings[k] = v
		}
	}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var conf bytes.Buffer
	conf.WriteString("\n# written by internal/pgcluster\n")
	for _, k := range keys {
		fmt.Fprintf(&conf, "%s = %s\n", k, settings[k])
	}
	f, err := os.OpenFile(filepath.Join(c.dataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.Write(conf.Bytes())
	return err
}

// runningPort reports the port of a postmaster already serving DataDir.
func (c *Cluster) runningPort() (int, bool) {
	if c.run(context.Background(), "pg_ctl", "status", "-D", c.dataDir) != nil {
		return 0, false
	}
	// postmaster.pid line 4 is the port.
	pid, err := os.ReadFile(filepath.Join(c.dataDir, "postmaster.pid"))
	if err != nil {
		return 0, false
	}
	lines := strings.Split(string(pid), "\n")
	if len(lines) < 4 {
		return 0, false
	}
	port, err := strconv.Atoi(strings.TrimSpace(lines[3]))
	return port, err == nil
}

func (c *Cluster) start(ctx context.Context) error {
	logFile := filepath.Join(c.dataDir, "server.log")
	err := c.run(ctx, "pg_ctl", "start", "-w", "-t", "60", "-D", c.dataDir, "-l", logFile,
		"-o", fmt.Sprintf("-p %d", c.port))
	if err != nil {
		tail, _ := os.ReadFile(logFile)
		if len(tail) > 2000 {
			tail = tail[len(tail)-2000:]
		}
		return fmt.Errorf("%w\nserver.log:\n%s", err, tail)
	}
	return nil
}

// Postmaster identifies a running server by its pid and start time (from
// postmaster.pid): the pair never names another process, even once the pid
// is reused.
type Postmaster struct {
	PID   int
	Start int64 // Unix seconds
}

// Postmaster reads the running server's identity.
func (c *Cluster) Postmaster() (Postmaster, error) {
	raw, err := os.ReadFile(filepath.Join(c.dataDir, "postmaster.pid"))
	if err != nil {
		return Postmaster{}, err
	}
	lines := strings.Split(string(raw), "\n")
	if len(lines) < 3 {
		return Postmaster{}, fmt.Errorf("%s: postmaster.pid is short", c.dataDir)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(lines[0]))
	if err != nil {
		return Postmaster{}, fmt.Errorf("%s: postmaster.pid: %w", c.dataDir, err)
	}
	start, err := strconv.ParseInt(strings.TrimSpace(lines[2]), 10, 64)
	if err != nil {
		return Postmaster{}, fmt.Errorf("%s: postmaster.pid: %w", c.dataDir, err)
	}
	return Postmaster{PID: pid, Start: start}, nil
}

// StopCommand is the shell command an operator runs to stop this cluster
// by hand (as the postgres user when this process runs as root, as
// PostgreSQL does).
func (c *Cluster) StopCommand() string {
	cmd := fmt.Sprintf("%s stop -m fast -D %s", filepath.Join(c.binDir, "pg_ctl"), c.dataDir)
	if c.runAs != nil {
		return "runuser -u postgres -- " + cmd
	}
	return cmd
}

// Stop shuts the cluster down (fast mode: active sessions are disconnected).
func (c *Cluster) Stop() error {
	return c.run(context.Background(), "pg_ctl", "stop", "-w", "-m", "fast", "-D", c.dataDir)
}

// Adopted reports whether the cluster was already running when Start was
// called. Whoever started it owns it: an adopting process must not stop it.
func (c *Cluster) Adopted() bool { return c.adopted }

// Port is the TCP port on 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// DataDir is the cluster's directory.
func (c *Cluster) DataDir() string { return c.dataDir }

// URL returns a connection URL for database dbname as the superuser.
func (c *Cluster) URL(dbname string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, dbname)
}

func (c *Cluster) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, name), args...)
	cmd.Dir = "/"
	if c.runAs != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.runAs}
	}
	// pg_ctl's postmaster inherits our stdio unless told otherwise; -l sends it to a file.
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// pickPort is localport.Free; tests replace it to hand out a taken port.
var pickPort = localport.Free

// StartTemp starts a throwaway fast (fsync off) cluster in a new temporary
// directory. Close stops it and removes the directory.
func StartTemp(ctx context.Context, settings map[string]string) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "buzz-pg-")
	if err != nil {
		return nil, err
	}
	// MkdirTemp makes it 0700 for root; the postgres user must traverse it.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	c, err := Start(ctx, Options{DataDir: filepath.Join(dir, "data"), Ephemeral: true, Settings: settings})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c.tempRoot = dir
	return c, nil
}

// Close stops the cluster and, for a StartTemp cluster, deletes its files.
func (c *Cluster) Close() error {
	err := c.Stop()
	if c.tempRoot != "" {
		if rmErr := os.RemoveAll(c.tempRoot); err == nil {
			err = rmErr
		}
	}
	return err
}

// basebackup copies the primary at opts.StandbyOf into the empty data
// directory with the settings to follow it (-R), then appends opts.Settings.
func (c *Cluster) basebackup(ctx context.Context, opts Options) error {
	args := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(opts.StandbyOf), "-U", "postgres",
		"-D", c.dataDir, "-R", "-X", "stream", "--no-sync", "-c", "fast"}
	if opts.StandbySlot != "" {
		args = append(args, "-C", "-S", opts.StandbySlot)
	}
	if err := c.run(ctx, "pg_basebackup", args...); err != nil {
		return err
	}
	var conf bytes.Buffer
	conf.WriteString("\n# standby settings written by internal/pgcluster\nhot_standby = on\n")
	keys := make([]string, 0, len(opts.Settings))
	for k := range opts.Settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&conf, "%s = %s\n", k, opts.Settings[k])
	}
	f, err := os.OpenFile(filepath.Join(c.dataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.Write(conf.Bytes())
	return err
}

// StartStandby starts a throwaway streaming hot standby of primary (a
// cluster on 127.0.0.1 that allows replication connections, as initdb's
// defaults do on loopback) in a new temporary directory, on a port of its
// own. settings are extra postgresql.conf lines. Close stops it and
// removes its files.
func StartStandby(ctx context.Context, primary *Cluster, settings map[string]string) (*Cluster, error) {
	return StartStandbyOf(ctx, primary.port, settings)
}

// StartStandbyOf is StartStandby for a primary known only by its port.
func StartStandbyOf(ctx context.Context, primaryPort int, settings map[string]string) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "buzz-pg-standby-")
	if err != nil {
		return nil, err
	}
	// MkdirTemp makes it 0700 for root; the postgres user must traverse it.
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	// The directory's random suffix names the slot: unique on the primary.
	slot := "buzz_standby_" + strings.ToLower(strings.TrimPrefix(filepath.Base(dir), "buzz-pg-standby-"))
	c, err := Start(ctx, Options{DataDir: filepath.Join(dir, "data"), Settings: settings, StandbyOf: primaryPort, StandbySlot: slot})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c.tempRoot = dir
	return c, nil
}

// Kill stops the cluster at once (immediate mode: no shutdown checkpoint,
// sessions cut), as a crash or a lost host would.
func (c *Cluster) Kill() error {
	return c.run(context.Background(), "pg_ctl", "stop", "-w", "-m", "immediate", "-D", c.dataDir)
}
