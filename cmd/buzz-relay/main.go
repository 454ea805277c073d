// Command buzz-relay runs the Buzz relay.
//
//	buzz-relay serve            serve with BUZZ_DATABASE_URL (refuses a database that is behind)
//	buzz-relay migrate          apply pending migrations (the only migrator)
//	buzz-relay migrate status   print the applied and latest versions as JSON
//	buzz-relay migrate to N     migrate up to version N, or down with --destroy-data
//	buzz-relay dev              private PostgreSQL under $BUZZ_DEV_DATA_DIR (default .data/) unless
//	                            BUZZ_DATABASE_URL is set; migrate, seed, serve on loopback
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/migrate"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/outbox"
	"github.com/buzzrelay/buzz/internal/pgcluster"
	"github.com/buzzrelay/buzz/internal/pgsession"
	"github.com/buzzrelay/buzz/internal/pguuid"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/replica"
)

const usage = `usage: buzz-relay <command>

  serve            serve the relay (BUZZ_DATABASE_URL required)
  migrate          apply pending migrations
  migrate status   print {"current":N,"latest":M}
  migrate to N [--destroy-data]
                   migrate up to version N; down (dropping data) only with --destroy-data
  dev              run with a private PostgreSQL under .data/ (loopback only)
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cfg, err := config.FromEnv(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "buzz-relay: configuration:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	switch os.Args[1] {
	case "serve":
		var ls addresses
		if ls, err = listen(cfg, nil); err == nil {
			err = serve(ctx, cfg, log, ls, os.Getenv)
		}
	case "migrate":
		err = runMigrate(ctx, cfg, os.Args[2:])
	case "dev":
		var opts devOptions
		if opts, err = devOptionsFromEnv(os.Getenv); err == nil {
			err = dev(ctx, cfg, log, opts, os.Getenv)
		}
	default:
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var u usageError
	if errors.As(err, &u) {
		fmt.Fprintf(os.Stderr, "buzz-relay: %s\n%s", u.msg, usage)
		os.Exit(2)
	}
	if err != nil {
		log.Error("buzz-relay failed", "err", err)
		os.Exit(1)
	}
}

func requireDatabaseURL(cfg config.Config) error {
	if cfg.DatabaseURL == "" {
		return errors.New("BUZZ_DATABASE_URL is not set (use `buzz-relay dev` for a private database)")
	}
	return nil
}

// usageError is a command line that names no command: main prints it with
// the usage and exits 2, as for an unknown command.
type usageError struct{ msg string }

func (u usageError) Error() string { return u.msg }

func runMigrate(ctx context.Context, cfg config.Config, args []string) error {
	// The arguments are checked before connecting: a typo is a usage error
	// whether or not the database is reachable.
	version, destroy := int64(-1), false
	switch {
	case len(args) == 0 || len(args) == 1 && args[0] == "up":
	case len(args) == 1 && args[0] == "status":
	case args[0] == "to" && (len(args) == 2 || len(args) == 3 && args[2] == "--destroy-data"):
		v, err := strconv.ParseInt(args[1], 10, 32)
		if err != nil || v < 0 {
			return usageError{fmt.Sprintf("migrate to %q: want a version number (0 or more)", args[1])}
		}
		version, destroy = v, len(args) == 3
	default:
		return usageError{fmt.Sprintf("migrate %v: unknown arguments", args)}
	}
	if err := requireDatabaseURL(cfg); err != nil {
		return err
	}
	conn, err := connectMigrator(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	switch {
	case len(args) > 0 && args[0] == "status":
		st, err := migrate.CurrentStatus(ctx, conn)
		if err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(st)
	case version < 0:
		return migrate.Up(ctx, conn)
	}
	if destroy {
		return migrate.To(ctx, conn, int32(version))
	}
	// A typo (1 for 18) must not drop events; decided under the migrator
	// lock, from the version this run will start from.
	return migrate.ToKeepingData(ctx, conn, int32(version))
}

// connectMigrator opens the migrator's session, named buzz-migrate: an
// operator waiting on a migration's lock finds its holder by that name.
func connectMigrator(ctx context.Context, url string) (*pgx.Conn, error) {
	connCfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("BUZZ_DATABASE_URL: %w", err)
	}
	pgsession.Name(&connCfg.Config, pgsession.Migrate)
	return pgx.ConnectConfig(ctx, connCfg)
}

// addresses are the relay's bound listeners: the public one every
// community's host reaches, and the operator-only metrics one.
type addresses struct {
	public, metrics net.Listener
}

func (a addresses) Close() {
	for _, l := range []net.Listener{a.public, a.metrics} {
		if l != nil {
			l.Close()
		}
	}
}

// listen binds the relay's addresses before anything else starts, so a
// second relay on a taken port fails at once instead of after it has
// touched the database. public, when not nil, is already bound.
func listen(cfg config.Config, public net.Listener) (addresses, error) {
	a := addresses{public: public}
	var err error
	if a.public == nil {
		if a.public, err = net.Listen("tcp", cfg.ListenAddr); err != nil {
			return a, fmt.Errorf("listen on %s (is another relay running there? set BUZZ_LISTEN_ADDR): %w", cfg.ListenAddr, err)
		}
	}
	if a.metrics, err = net.Listen("tcp", cfg.MetricsAddr); err != nil {
		a.Close()
		return addresses{}, fmt.Errorf("listen on BUZZ_METRICS_ADDR %s (is another relay running there?): %w", cfg.MetricsAddr, err)
	}
	return a, nil
}

// minIdleInTransactionTimeout is the least idle_in_transaction_session_timeout
// serve sets: it applies to every transaction of the pool, and a round trip
// or a pause of the process under load must not end a healthy one.
const minIdleInTransactionTimeout = 5 * time.Second

// armIdleInTransactionTimeout sets each new session's
// idle_in_transaction_session_timeout to writeTimeout (at least
// minIdleInTransactionTimeout) unless the operator set it for the relay:
// in BUZZ_DATABASE_URL (a parameter or options, source "client") or with
// ALTER ROLE / ALTER DATABASE ... SET. A process that stops running
// mid-transaction (frozen, or cut off without a FIN reaching the server)
// would keep its locks, a channel's write lock among them, and block that
// channel's writes on every process for as long as it stays away. The relay
// never leaves a transaction waiting on itself for longer than it lets a
// write take, so the server may end one left idle that long. It is set
// after connecting, not as a startup parameter: PostgreSQL applies a
// startup parameter over the role's and the database's settings. A
// cluster-wide value (postgresql.conf, ALTER SYSTEM) is not the relay's
// own and is overridden.
func armIdleInTransactionTimeout(cfg *pgxpool.Config, writeTimeout time.Duration) {
	idle := strconv.FormatInt(max(writeTimeout, minIdleInTransactionTimeout).Milliseconds(), 10)
	connected := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if connected != nil {
			if err := connected(ctx, conn); err != nil {
				return err
			}
		}
		_, err := conn.Exec(ctx, setIdleInTransactionTimeoutUnlessOperators, idle)
		return err
	}
}

// setIdleInTransactionTimeoutUnlessOperators sets the session's timeout
// unless its value came from the connection or from the relay's role or
// database (ALTER ROLE ALL is "global", the cluster's, and overridden).
const setIdleInTransactionTimeoutUnlessOperators = `-- name: SessionIdleInTransactionTimeoutSet
SELECT set_config(name, $1, false)
FROM pg_settings
WHERE name = 'idle_in_transaction_session_timeout'
  AND source NOT IN ('client', 'user', 'database', 'database user')`

// serve runs the relay on ls, which it closes on return, until ctx ends;
// getenv supplies the settings that are not part of config.Config (the
// operator listeners).
func serve(ctx context.Context, cfg config.Config, log *slog.Logger, ls addresses, getenv func(string) string) error {
	defer ls.Close()
	if err := requireDatabaseURL(cfg); err != nil {
		return err
	}
	// A malformed BUZZ_OPERATOR_LISTENERS stops start-up: a pod that silently
	// dropped a listener would leave its mentions undelivered.
	listeners, err := outbox.ConfigFromEnv(getenv)
	if err != nil {
		return fmt.Errorf("operator listeners: %w", err)
	}
	poolCfg, err := pguuid.ParsePoolConfig(cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("BUZZ_DATABASE_URL: %w", err)
	}
	poolCfg.MaxConns = cfg.DBMaxConns
	poolCfg.ConnConfig.Tracer = relay.NewStatementTimer() // buzz_db_query_seconds{query}
	armIdleInTransactionTimeout(poolCfg, cfg.IngestWriteTimeout)
	pgsession.Name(&poolCfg.ConnConfig.Config, pgsession.Relay)
	if cfg.ReadDatabaseURL != "" {
		// Routed reads rely on every writer session refusing channel
		// events dated before the floor.
		replica.ArmFloor(poolCfg, cfg.CreatedAtFloor)
	}
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return err
	}
	// Closing the pool waits for every connection in use, and a statement
	// on a stalled server (a stopped backend, a partitioned network) never
	// returns: bound that wait, so SIGTERM still ends the process.
	defer closePool(log, pool, poolCloseWait)

	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("connect to database: %w", err)
	}
	err = migrate.RequireCurrent(ctx, conn.Conn())
	conn.Release()
	if err != nil {
		return err
	}
	// The deployment's own community (BUZZ_RELAY_URL) always exists.
	home, err := community.Ensure(ctx, db.New(pool), cfg.RelayHost())
	if err != nil {
		return fmt.Errorf("seed community %q: %w", cfg.RelayHost(), err)
	}

	mediaSvc, err := newMediaService(cfg)
	if err != nil {
		return err
	}
	var relayOpts []relay.Option
	if mediaSvc != nil {
		relayOpts = append(relayOpts, relay.WithMedia(mediaSvc))
		log.Info("media enabled", "store", cfg.MediaStore, "dir", cfg.MediaDir, "bucket", cfg.MediaS3Bucket)
	}
	srv := relay.New(cfg, pool, log, relayOpts...)
	go srv.RunReapers(ctx)
	go srv.RunExpiredPurge(ctx)
	go srv.RunListFolder(ctx)
	go srv.KeepEventStatistics(ctx)
	go srv.WatchCommunityClosures(ctx)
	// The bus outlives the signal and stops last (StopCrossRelay): its
	// goodbye vouches for every event committed before it, and the
	// connections and workers finishing after the signal commit more.
	if err := srv.StartCrossRelay(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	// On every way out, the shutdown's below included (a second call does
	// nothing): a return on a failed start must not leave the bus running.
	defer stopCrossRelay(srv, log)
	if err := srv.StartReadReplica(ctx); err != nil {
		return err
	}
	srv.StartMediaSweep(ctx)
	if err := srv.StartWorkflows(ctx); err != nil {
		return err
	}
	if err := srv.StartOperatorListeners(ctx, listeners, home.ID); err != nil {
		return fmt.Errorf("operator listeners: %w", err)
	}
	httpSrv := srv.HTTPServer()
	metricsSrv := srv.MetricsServer()
	defer metricsSrv.Close()
	log.Info("relay listening", "addr", ls.public.Addr().String(), "relay_url", cfg.RelayURL, "community", home.Host,
		"signature_verifier", nostr.SignatureVerifier())
	log.Info("metrics listening", "addr", ls.metrics.Addr().String())
	errc := make(chan error, 3)
	go func() { errc <- httpSrv.Serve(ls.public) }()
	go func() { errc <- metricsSrv.Serve(ls.metrics) }()
	if cfg.PprofAddr != "" {
		// Profiling stays off the public listener.
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		pprofSrv := &http.Server{Addr: cfg.PprofAddr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		defer pprofSrv.Close()
		go func() { errc <- pprofSrv.ListenAndServe() }()
		log.Info("pprof listening", "addr", cfg.PprofAddr)
	}

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: closing connections")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownBudget)
	defer cancel()
	_ = httpSrv.Shutdown(shutdownCtx) // stop accepting; hijacked WebSockets are ours to close
	if err := srv.Shutdown(shutdownCtx); err != nil {
		log.Warn("connections did not drain in time", "err", err)
	}
	// The workers saw ctx end with the signal and are finishing what is in
	// flight (a delivery within its request timeout, a workflow step).
	if err := srv.WaitForWorkers(shutdownCtx); err != nil {
		log.Warn("deliveries or workflow steps in flight did not finish in time", "err", err)
	}
	stopCrossRelay(srv, log)
	return nil
}

// stopCrossRelay says this process's goodbye to the other relay processes,
// within its own budget: the connections and workers may have spent the
// shutdown's, and the goodbye is one publish of what is queued.
func stopCrossRelay(srv *relay.Server, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), goodbyeBudget)
	defer cancel()
	if err := srv.StopCrossRelay(ctx); err != nil {
		log.Warn("the goodbye to the other relay processes did not finish in time; they will take this one for dead and replay what it committed", "err", err)
	}
}

const (
	// shutdownBudget bounds draining connections and the workers' steps and
	// deliveries in flight after SIGTERM.
	shutdownBudget = 15 * time.Second
	// goodbyeBudget bounds publishing what is still queued for the other
	// relay processes and the goodbye (one publish of at most 2 s) after
	// the connections and workers are done.
	goodbyeBudget = 3 * time.Second
	// poolCloseWait is how long, past that budget, closing the database
	// pool may wait for connections still in use before the process exits
	// without them.
	poolCloseWait = 5 * time.Second
)

// closePool closes pool, waiting at most wait for the connections still in
// use (a statement on a stalled server holds its connection for as long as
// the TCP connection lives, which for a stopped backend is forever).
func closePool(log *slog.Logger, pool *pgxpool.Pool, wait time.Duration) {
	closed := make(chan struct{})
	go func() {
		pool.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(wait):
		log.Warn("database connections still in use at exit; leaving them to the server", "in_use", pool.Stat().AcquiredConns())
	}
}

// newMediaService builds the Blossom media service the settings describe;
// nil when media is off (the filesystem store without a directory).
func newMediaService(cfg config.Config) (*media.Service, error) {
	store, err := media.OpenStore(cfg)
	if err != nil || store == nil {
		return nil, err
	}
	limits := media.Limits{MaxBytes: int64(cfg.MediaMaxBytes), AllowedTypes: cfg.MediaAllowedTypes, TempDir: cfg.MediaTempDir}
	return media.NewService(store, limits, nil), nil
}

// devOptions locate the dev relay's private cluster.
type devOptions struct {
	DataDir string // BUZZ_DEV_DATA_DIR, default .data
	PGPort  int    // BUZZ_DEV_PG_PORT, default 54329
	// Replica (BUZZ_DEV_REPLICA=1) adds a streaming standby of the private
	// cluster under DataDir/postgres-replica, on ReplicaPort
	// (BUZZ_DEV_REPLICA_PORT, default 54330), and routes reads to it.
	Replica     bool
	ReplicaPort int
	// Listener, when set, is the relay's already bound address (tests bind
	// port 0 and hand it over, so no other process can take the port
	// between choosing and binding it); nil binds cfg.ListenAddr.
	Listener net.Listener
}

func devOptionsFromEnv(getenv func(string) string) (devOptions, error) {
	opts := devOptions{DataDir: ".data", PGPort: 54329, ReplicaPort: 54330}
	if v := getenv("BUZZ_DEV_DATA_DIR"); v != "" {
		opts.DataDir = v
	}
	if v := getenv("BUZZ_DEV_PG_PORT"); v != "" {
		port, err := strconv.Atoi(v)
		if err != nil || port <= 0 || port > 65535 {
			return opts, fmt.Errorf("BUZZ_DEV_PG_PORT=%q: want a port number", v)
		}
		opts.PGPort = port
	}
	if v := getenv("BUZZ_DEV_REPLICA"); v != "" {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return opts, fmt.Errorf("BUZZ_DEV_REPLICA=%q: want 1 or 0", v)
		}
		opts.Replica = on
	}
	if v := getenv("BUZZ_DEV_REPLICA_PORT"); v != "" {
		port, err := strconv.Atoi(v)
		if err != nil || port <= 0 || port > 65535 {
			return opts, fmt.Errorf("BUZZ_DEV_REPLICA_PORT=%q: want a port number", v)
		}
		opts.ReplicaPort = port
	}
	return opts, nil
}

// dev runs the relay for a developer: loopback only (unless BUZZ_LISTEN_ADDR
// says otherwise), and a private cluster under DataDir/postgres that survives
// restarts, unless BUZZ_DATABASE_URL names a database.
//
// Start-up order matters when a developer runs it twice: the data directory
// lock and the listen address are taken before the cluster is touched, and
// the cluster is stopped on exit only if this process started it, so a
// second instance can never take the first one's database away.
func dev(ctx context.Context, cfg config.Config, log *slog.Logger, opts devOptions, getenv func(string) string) error {
	if cfg.ListenAddr == config.Default().ListenAddr {
		cfg.ListenAddr = "127.0.0.1:3000"
	}
	if cfg.MediaStore == "fs" && cfg.MediaDir == "" {
		cfg.MediaDir = filepath.Join(opts.DataDir, "media")
	}
	listener := opts.Listener
	if listener != nil {
		cfg.ListenAddr = listener.Addr().String()
	}
	unlock, err := lockDataDir(opts.DataDir, cfg.ListenAddr)
	if err != nil {
		if listener != nil {
			listener.Close()
		}
		return err
	}
	defer unlock()
	ls, err := listen(cfg, listener)
	if err != nil {
		return err
	}
	defer ls.Close()
	if cfg.DatabaseURL == "" {
		pgDir := filepath.Join(opts.DataDir, "postgres")
		log.Info("starting private PostgreSQL", "dir", pgDir, "port", opts.PGPort)
		cluster, stop, err := startDevCluster(ctx, log, opts.DataDir, "PostgreSQL", pgcluster.Options{DataDir: pgDir, Port: opts.PGPort})
		if err != nil {
			return err
		}
		defer stop()
		if err := ensureDatabase(ctx, cluster.URL("postgres"), "buzz"); err != nil {
			return err
		}
		cfg.DatabaseURL = cluster.URL("buzz")
		// buzz-admin and the psql runbooks need it as BUZZ_DATABASE_URL.
		log.Info("private PostgreSQL ready", "database_url", cfg.DatabaseURL)
		if opts.Replica && cfg.ReadDatabaseURL == "" {
			standby, stop, err := devReplica(ctx, log, opts, cluster.Port())
			if err != nil {
				return err
			}
			defer stop()
			cfg.ReadDatabaseURL = standby.URL("buzz")
			if cfg.ReplicaReadMaxAge == 0 {
				// Let recent reads route too, so routing shows at once.
				cfg.ReplicaReadMaxAge = time.Second
			}
		}
	}
	if err := runMigrate(ctx, cfg, nil); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return serve(ctx, cfg, log, ls, getenv)
}

// devReplica starts (or adopts) the dev cluster's streaming standby: made
// once by pg_basebackup from the primary, kept under DataDir like it.
func devReplica(ctx context.Context, log *slog.Logger, opts devOptions, primaryPort int) (*pgcluster.Cluster, func(), error) {
	dir := filepath.Join(opts.DataDir, "postgres-replica")
	log.Info("starting private PostgreSQL standby", "dir", dir, "port", opts.ReplicaPort)
	standby, stop, err := startDevCluster(ctx, log, opts.DataDir, "PostgreSQL standby",
		pgcluster.Options{DataDir: dir, Port: opts.ReplicaPort, StandbyOf: primaryPort})
	if err != nil {
		return nil, nil, fmt.Errorf("dev standby: %w", err)
	}
	return standby, stop, nil
}

// startDevCluster starts a dev cluster and returns how to stop it on exit,
// with the server's identity (pid and start time) recorded in a file
// beside it under dataDir. The caller holds the data directory's lock, so
// no other dev relay is using the cluster: a server found already running
// that the record names was started by a dev relay that died without
// stopping it (kill -9 of `make run`; pg_ctl detaches the server). That
// orphan is adopted, and stopped on exit like one this process started.
// Any other server running there was started by hand or by another tool:
// taking it over, or stopping it on exit, could pull a database from under
// its owner, so dev stops with the command that stops it.
func startDevCluster(ctx context.Context, log *slog.Logger, dataDir, what string, opts pgcluster.Options) (*pgcluster.Cluster, func(), error) {
	cluster, err := pgcluster.Start(ctx, opts)
	if err != nil {
		return nil, nil, err
	}
	record := filepath.Join(dataDir, "buzz-relay-dev."+filepath.Base(opts.DataDir)+".server")
	server, err := cluster.Postmaster()
	if err != nil {
		if !cluster.Adopted() {
			_ = cluster.Stop()
		}
		return nil, nil, fmt.Errorf("%s on %s: %w", what, opts.DataDir, err)
	}
	if cluster.Adopted() {
		var recorded pgcluster.Postmaster
		raw, _ := os.ReadFile(record)
		if json.Unmarshal(raw, &recorded) != nil || recorded != server {
			return nil, nil, fmt.Errorf("a %s that no dev relay started is already running on %s (pid %d, port %d); "+
				"stop it with `%s` and run again, or use it as an existing database with BUZZ_DATABASE_URL=%s",
				what, cluster.DataDir(), server.PID, cluster.Port(), cluster.StopCommand(), cluster.URL("buzz"))
		}
		log.Warn("adopted the "+what+" a dev relay left running when it was killed; stopping it on exit like one this relay started",
			"dir", opts.DataDir, "pid", server.PID, "port", cluster.Port())
	} else {
		raw, _ := json.Marshal(server)
		if err := os.WriteFile(record, raw, 0o644); err != nil {
			_ = cluster.Stop()
			return nil, nil, fmt.Errorf("record the %s started: %w", what, err)
		}
	}
	return cluster, func() {
		log.Info("stopping private " + what)
		if err := cluster.Stop(); err != nil {
			log.Warn("stop "+what, "err", err)
			return
		}
		_ = os.Remove(record)
	}, nil
}

func ensureDatabase(ctx context.Context, adminURL, name string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	return err
}
