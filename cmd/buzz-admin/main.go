// Command buzz-admin is the operator CLI. It talks to the database named by
// BUZZ_DATABASE_URL and prints JSON, one document per command.
//
//	buzz-admin communities create HOST
//	buzz-admin communities list
//	buzz-admin communities archive HOST
//	buzz-admin communities unarchive HOST
//	buzz-admin listeners list [LISTENER]
//	buzz-admin listeners add LISTENER TARGET...
//	buzz-admin listeners remove LISTENER TARGET...
//	buzz-admin deletions sweep|submit|list|inspect|approve|unblock|run|drain
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/pgsession"
	"github.com/buzzrelay/buzz/internal/pguuid"
)

const usage = `usage: buzz-admin communities create HOST | list | archive HOST | unarchive HOST
       buzz-admin listeners list [LISTENER] | add LISTENER TARGET... | remove LISTENER TARGET...
` + deletionsUsage + `
BUZZ_DATABASE_URL names the database; deletions also read the media store and
BUZZ_REDIS_URL settings of the relay. BUZZ_ADMIN_CONNECT_TIMEOUT bounds each
connection attempt (default 10s; else the URL's connect_timeout when it sets
one): an unreachable database host is an error, not a hang.
SIGINT (Ctrl-C) or SIGTERM cancels the command: statements in flight are
cancelled (work committed before them stays) and it exits 130 or 143; a
second SIGINT kills it at once.`

func main() {
	ctx, interrupted := cancelOnSignal(context.Background())
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	if sig := interrupted(); sig != nil {
		err = interruptedError{sig: sig, err: err}
	}
	os.Exit(exitStatus(err, os.Stdout, os.Stderr))
}

// cancelOnSignal returns a context that SIGINT or SIGTERM cancels, so the
// statement in flight is cancelled on the server rather than left to run
// (and commit) after the process is gone, and interrupted, which tells the
// signal once one came. After the first signal the default action is back:
// a second Ctrl-C kills a command that does not stop.
func cancelOnSignal(parent context.Context) (context.Context, func() os.Signal) {
	ctx, cancel := context.WithCancel(parent)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	var caught atomic.Value
	go func() {
		sig := <-signals
		signal.Stop(signals)
		caught.Store(sig)
		cancel()
	}()
	return ctx, func() os.Signal {
		sig, _ := caught.Load().(os.Signal)
		return sig
	}
}

// interruptedError is a command a signal cancelled: exit status 128 plus
// the signal's number, as a shell reports a process the signal killed.
type interruptedError struct {
	sig os.Signal
	err error // what the command returned, cancelled
}

func (e interruptedError) Error() string {
	msg := fmt.Sprintf("interrupted by %s: the command was cancelled, and statements in flight with it; what it had committed before stays", signalName(e.sig))
	if e.err != nil && !errors.Is(e.err, context.Canceled) {
		msg += " (" + e.err.Error() + ")"
	}
	return msg
}

func signalName(sig os.Signal) string {
	if sig == syscall.SIGTERM {
		return "SIGTERM"
	}
	return "SIGINT"
}

func (e interruptedError) exitCode() int {
	if s, ok := e.sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 130
}

// exitStatus reports what run came to and returns the process's exit
// status: 0 when it succeeded or help was asked for (the usage goes to
// stdout), 2 for a command line that cannot run (the usage goes to
// stderr), else the command's own status (1 unless it says otherwise),
// its error as JSON on stderr.
func exitStatus(err error, stdout, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stdout, usage)
		return 0
	}
	var u usageError
	if errors.As(err, &u) {
		if u.reason != "" {
			fmt.Fprintln(stderr, "buzz-admin: "+u.reason)
		}
		fmt.Fprintln(stderr, usage)
		return 2
	}
	code := 1
	var exit exitError
	var interrupted interruptedError
	if errors.As(err, &interrupted) {
		code = interrupted.exitCode()
	} else if errors.As(err, &exit) {
		code = exit.code
		err = exit.err
	}
	if err != nil {
		_ = json.NewEncoder(stderr).Encode(map[string]string{"error": err.Error()})
	}
	return code
}

// usageError is a command line that cannot run: exit status 2, with the
// usage, and the reason when one flag is wrong.
type usageError struct{ reason string }

func (u usageError) Error() string {
	if u.reason != "" {
		return u.reason
	}
	return "usage"
}

// connect opens the database named by BUZZ_DATABASE_URL.
func connect(ctx context.Context, getenv func(string) string) (*pgx.Conn, error) {
	url := getenv("BUZZ_DATABASE_URL")
	if url == "" {
		return nil, errors.New("BUZZ_DATABASE_URL is not set")
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("BUZZ_DATABASE_URL: %w", err)
	}
	if cfg.ConnectTimeout, err = connectTimeout(getenv, cfg.ConnectTimeout); err != nil {
		return nil, err
	}
	cancelOnServer(&cfg.Config)
	pgsession.Name(&cfg.Config, pgsession.Admin)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, connectError(cfg.ConnectTimeout, err)
	}
	return conn, nil
}

// connectPool opens a pool on the database named by BUZZ_DATABASE_URL,
// its sessions set up as connect's.
func connectPool(ctx context.Context, getenv func(string) string) (*pgxpool.Pool, error) {
	url := getenv("BUZZ_DATABASE_URL")
	if url == "" {
		return nil, errors.New("BUZZ_DATABASE_URL is not set")
	}
	cfg, err := pguuid.ParsePoolConfig(url)
	if err != nil {
		return nil, fmt.Errorf("BUZZ_DATABASE_URL: %w", err)
	}
	if cfg.ConnConfig.ConnectTimeout, err = connectTimeout(getenv, cfg.ConnConfig.ConnectTimeout); err != nil {
		return nil, err
	}
	cancelOnServer(&cfg.ConnConfig.Config)
	pgsession.Name(&cfg.ConnConfig.Config, pgsession.Admin)
	return pgxpool.NewWithConfig(ctx, cfg)
}

// defaultConnectTimeout bounds a connection attempt when neither
// BUZZ_ADMIN_CONNECT_TIMEOUT nor the URL does: without a bound a dead host
// holds the command for as long as the kernel retries its SYN (minutes).
const defaultConnectTimeout = 10 * time.Second

// connectTimeout is BUZZ_ADMIN_CONNECT_TIMEOUT, else the URL's
// connect_timeout (fromURL, 0 when it sets none), else the default.
func connectTimeout(getenv func(string) string, fromURL time.Duration) (time.Duration, error) {
	if v := getenv("BUZZ_ADMIN_CONNECT_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return 0, fmt.Errorf("BUZZ_ADMIN_CONNECT_TIMEOUT: want a positive duration such as 10s, got %q", v)
		}
		return d, nil
	}
	if fromURL > 0 {
		return fromURL, nil
	}
	return defaultConnectTimeout, nil
}

// cancelOnServer makes a cancelled context cancel the statement in flight
// on the server. pgx's default only drops the connection, and a backend
// waiting for a lock does not notice: its statement would go on, and an
// autocommitted one commit, after the operator's Ctrl-C. The socket is
// closed if the server has not answered the cancel request by then.
func cancelOnServer(cfg *pgconn.Config) {
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: 5 * time.Second}
	}
}

// connectError says which bound a failed connection ran into.
func connectError(timeout time.Duration, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("connect to the database: no answer within %s (BUZZ_ADMIN_CONNECT_TIMEOUT): %w", timeout, err)
	}
	return fmt.Errorf("connect to the database: %w", err)
}

// communityJSON is the stable JSON shape of a community.
type communityJSON struct {
	ID            uuid.UUID  `json:"id"`
	Host          string     `json:"host"`
	CreatedAt     time.Time  `json:"created_at"`
	ArchivedAt    *time.Time `json:"archived_at"`
	DeletionState string     `json:"deletion_state"`
}

func toJSON(c db.Community) communityJSON {
	return communityJSON{ID: c.ID, Host: c.Host, CreatedAt: c.CreatedAt, ArchivedAt: c.ArchivedAt, DeletionState: c.DeletionState}
}

func run(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		return flag.ErrHelp
	}
	if len(args) >= 2 && args[0] == "deletions" {
		return runDeletions(ctx, args[1], args[2:], getenv, out)
	}
	if len(args) >= 2 && args[0] == "listeners" {
		return runListeners(ctx, args[1], args[2:], getenv, out)
	}
	if len(args) < 2 || args[0] != "communities" {
		return usageError{}
	}
	verb, rest := args[1], args[2:]
	needHost := verb == "create" || verb == "archive" || verb == "unarchive"
	// A mistyped verb is a usage error before any connection is tried.
	if (needHost && len(rest) != 1) || (!needHost && (verb != "list" || len(rest) != 0)) {
		return usageError{}
	}
	var host string
	if needHost {
		if host = community.NormalizeHost(rest[0]); host == "" {
			return usageError{reason: fmt.Sprintf("host %q is empty after normalization", rest[0])}
		}
		// Only a new host must be reachable: archive and unarchive find
		// whatever is stored.
		if verb == "create" {
			if err := community.CheckHost(host); err != nil {
				return usageError{reason: err.Error()}
			}
		}
	}
	conn, err := connect(ctx, getenv)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if err := checkDatabase(ctx, conn, verb != "list"); err != nil {
		return err
	}
	q := db.New(conn)

	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	switch verb {
	case "create":
		row, err := q.CommunityCreate(ctx, host)
		if v, ok := dberr.AsViolation(err); ok && v.Constraint == "communities_host_key" {
			return fmt.Errorf("host %q is already taken (hosts of archived and deleted communities stay reserved)", host)
		}
		if err != nil {
			return err
		}
		return enc.Encode(toJSON(row))
	case "list":
		rows, err := q.CommunityList(ctx)
		if err != nil {
			return err
		}
		list := make([]communityJSON, 0, len(rows))
		for _, r := range rows {
			list = append(list, toJSON(r))
		}
		return enc.Encode(list)
	case "archive", "unarchive":
		var row db.Community
		if verb == "archive" {
			row, err = q.CommunityArchive(ctx, db.CommunityArchiveParams{Host: host})
		} else {
			row, err = q.CommunityUnarchive(ctx, host)
		}
		if dberr.IsNotFound(err) {
			return fmt.Errorf("no community has host %q", host)
		}
		if errors.Is(dberr.Interpret(err), dberr.ErrNotInPrerequisiteState) {
			return lifecycleRefusal(ctx, q, verb, host, err)
		}
		if err != nil {
			return err
		}
		return enc.Encode(toJSON(row))
	}
	return usageError{}
}

// lifecycleRefusal says why verb (archive, unarchive) was refused for the
// community at host, err being the refusal: once its deletion has begun,
// only the deletion executor changes a community's lifecycle, and the
// database's own words for that name the community's id, not its host.
func lifecycleRefusal(ctx context.Context, q *db.Queries, verb, host string, err error) error {
	c, gerr := q.CommunityByHost(ctx, host)
	if gerr != nil || c.DeletionState == "active" {
		return err
	}
	return fmt.Errorf("community %q is deleted or being deleted (deletion state %s): it can no longer be %sd, and its host stays reserved", host, c.DeletionState, verb)
}
