// Package migrate applies the embedded tern migrations.
//
// Exactly one process migrates: `buzz-relay migrate`. Relays never migrate on
// start-up; `serve` only checks the version and refuses to run when the
// database is behind. The reason is operational: several relay pods racing to
// migrate serialize on tern's advisory lock, and a migration that runs
// CREATE INDEX CONCURRENTLY (tern's disable-tx mode) waits for every other
// transaction touching the table, including the waiting migrators' own
// sessions, which deadlocks the rollout. Several `buzz-relay migrate` runs
// at once queue on lockMigrator instead.
package migrate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"

	"github.com/buzzrelay/buzz/migrations"
)

// VersionTable is tern's bookkeeping table.
const VersionTable = "public.schema_version"

// Status is where a database stands against the embedded migrations.
type Status struct {
	Current int32 `json:"current"`
	Latest  int32 `json:"latest"`
}

// Behind reports whether migrations are pending.
func (s Status) Behind() bool { return s.Current < s.Latest }

func newMigrator(ctx context.Context, conn *pgx.Conn) (*migrate.Migrator, error) {
	m, err := migrate.NewMigrator(ctx, conn, VersionTable)
	if err != nil {
		return nil, fmt.Errorf("migrator: %w", err)
	}
	if err := m.LoadMigrations(migrations.FS); err != nil {
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	return m, nil
}

// Up applies every pending migration.
func Up(ctx context.Context, conn *pgx.Conn) error {
	return To(ctx, conn, -1)
}

// SchemaDestructionLockKey is the advisory lock a migration run holds
// exclusively and a community deletion's destructive steps hold shared:
// a migration adding a community-scoped table cannot commit between a
// deletion's catalog check and its purge. It spells "buzzdel1"; the SQL
// function community_schema_destruction_lock_key returns the same number.
const SchemaDestructionLockKey int64 = 0x62757a7a64656c31

// disableTx is tern's marker for a migration that runs outside a
// transaction: concurrent index builds and drops, or a backfill that
// commits in short transactions; never a new table.
var disableTx = regexp.MustCompile(`(?m)^---- tern: disable-tx ----$`)

// migratorLockKey serializes whole migration runs; it spells "buzzmig1".
const migratorLockKey int64 = 0x62757a7a6d696731

// lockMigrator waits until no other migration run is in progress. It polls
// pg_try_advisory_lock rather than waiting in pg_advisory_lock (as tern's own
// lock does): a session waiting inside a statement holds a snapshot, a
// concurrent index build in the other run waits for that snapshot while the
// waiter waits for the build's run, and PostgreSQL breaks the deadlock by
// cancelling one of them, which can leave an INVALID index that the next
// run's IF NOT EXISTS then records as migrated.
func lockMigrator(ctx context.Context, conn *pgx.Conn) (unlock func(), err error) {
	for {
		var locked bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", migratorLockKey).Scan(&locked); err != nil {
			return nil, fmt.Errorf("migrator lock: %w", err)
		}
		if locked {
			return func() {
				_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", migratorLockKey)
			}, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// To migrates up or down to version (0 drops everything, -1 is the latest),
// one migration at a time. Concurrent runs queue, each starting once the
// one before it has finished.
func To(ctx context.Context, conn *pgx.Conn, version int32) error {
	return to(ctx, conn, version, true)
}

// DestroysDataError is ToKeepingData refusing a run that would go down.
type DestroysDataError struct{ Version, Current int32 }

func (e *DestroysDataError) Error() string {
	return fmt.Sprintf("migrate to %d runs the down parts of migrations %d to %d, which drop their tables and columns with the data in them; add --destroy-data to do that", e.Version, e.Version+1, e.Current)
}

// ToKeepingData is To that refuses to go down, deciding from the version
// found once the run holds the migrator lock: a run queued behind another
// must not undo what that one applied.
func ToKeepingData(ctx context.Context, conn *pgx.Conn, version int32) error {
	return to(ctx, conn, version, false)
}

func to(ctx context.Context, conn *pgx.Conn, version int32, allowDown bool) error {
	unlock, err := lockMigrator(ctx, conn)
	if err != nil {
		return err
	}
	defer unlock()
	m, err := newMigrator(ctx, conn)
	if err != nil {
		return err
	}
	latest := int32(len(m.Migrations))
	if version < 0 {
		version = latest
	}
	if version > latest {
		return fmt.Errorf("no migration %d: the latest is %d", version, latest)
	}
	current, err := m.GetCurrentVersion(ctx)
	if err != nil {
		return err
	}
	if version < current && !allowDown {
		return &DestroysDataError{Version: version, Current: current}
	}
	if current != version {
		if err := refuseInvalidIndexes(ctx, conn); err != nil {
			return err
		}
	}
	for current != version {
		next, body := current+1, ""
		if current < version {
			body = m.Migrations[current].UpSQL
		} else {
			next, body = current-1, m.Migrations[current-1].DownSQL
		}
		if err := step(ctx, conn, m, next, !disableTx.MatchString(body)); err != nil {
			return err
		}
		current = next
	}
	return nil
}

// step applies the one migration that leads to version. A transactional
// migration holds the schema destruction lock, so a community-scoped table
// cannot appear between a deletion's catalog check and its purge. A
// disable-tx one must not: a concurrent index build waits for every older
// snapshot, including a purge's that queued for the lock behind it, and
// the two deadlock (the build is then cancelled, its index left INVALID).
func step(ctx context.Context, conn *pgx.Conn, m *migrate.Migrator, version int32, lock bool) (err error) {
	if lock {
		// A deletion purging right now holds the lock shared: wait for it
		// however long it takes. Only this wait is unbounded; the migration
		// itself runs under the session's own lock_timeout.
		if _, err := conn.Exec(ctx, "SET lock_timeout = 0"); err != nil {
			return err
		}
		if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", SchemaDestructionLockKey); err != nil {
			return fmt.Errorf("schema destruction lock: %w", err)
		}
		defer func() {
			if _, uerr := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", SchemaDestructionLockKey); err == nil {
				err = uerr
			}
		}()
		if _, err := conn.Exec(ctx, "RESET lock_timeout"); err != nil {
			return err
		}
	} else {
		// A concurrent index build blocks no writer while it waits for
		// older snapshots, and a timeout cancelling it leaves its index
		// INVALID; a backfill in short transactions sets its own. The
		// session's timeouts (the migrator role's) come back after the
		// step: tern resets the session after each migration.
		if _, err := conn.Exec(ctx, "SET lock_timeout = 0; SET statement_timeout = 0"); err != nil {
			return err
		}
		// tern resets only after a migration that succeeded.
		defer func() {
			if err != nil {
				_, _ = conn.Exec(context.WithoutCancel(ctx), "RESET lock_timeout; RESET statement_timeout")
			}
		}()
	}
	return m.MigrateTo(ctx, version)
}

// refuseInvalidIndexes stops a run while an index of the schema is
// INVALID: an interrupted CREATE INDEX CONCURRENTLY leaves one behind, a
// re-run's IF NOT EXISTS would keep it, and a later statement could drop
// the index it was to replace, leaving reads with neither.
func refuseInvalidIndexes(ctx context.Context, conn *pgx.Conn) error {
	rows, err := conn.Query(ctx, `
		SELECT format('%I.%I', n.nspname, c.relname)
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE NOT i.indisvalid AND n.nspname = current_schema()
		ORDER BY 1`)
	if err != nil {
		return fmt.Errorf("look for invalid indexes: %w", err)
	}
	invalid, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("look for invalid indexes: %w", err)
	}
	if len(invalid) == 0 {
		return nil
	}
	// CONCURRENTLY drops one index per statement.
	drops := make([]string, len(invalid))
	for i, name := range invalid {
		drops[i] = "DROP INDEX CONCURRENTLY " + name + ";"
	}
	return fmt.Errorf("index %s is INVALID (a CREATE INDEX CONCURRENTLY was interrupted or is running now); "+
		"once no build is running, run %s then migrate again",
		strings.Join(invalid, ", "), strings.Join(drops, " "))
}

// CurrentStatus reads the applied version without changing anything. A
// database that was never migrated reports version 0.
func CurrentStatus(ctx context.Context, conn *pgx.Conn) (Status, error) {
	latest, err := latestVersion()
	if err != nil {
		return Status{}, err
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", VersionTable).Scan(&exists); err != nil {
		return Status{}, err
	}
	st := Status{Latest: latest}
	if !exists {
		return st, nil
	}
	err = conn.QueryRow(ctx, "SELECT version FROM "+VersionTable).Scan(&st.Current)
	return st, err
}

// RequireCurrent fails unless every embedded migration has been applied.
func RequireCurrent(ctx context.Context, conn *pgx.Conn) error {
	st, err := CurrentStatus(ctx, conn)
	if err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	return st.RequireCurrent()
}

// RequireCurrent fails unless s has every embedded migration applied and
// none this build does not know.
func (s Status) RequireCurrent() error {
	switch {
	case s.Current < s.Latest:
		return fmt.Errorf("database schema is at version %d but this build needs %d: run `buzz-relay migrate` first", s.Current, s.Latest)
	case s.Current > s.Latest:
		return fmt.Errorf("database schema is at version %d, newer than this build knows (%d): deploy the newer relay", s.Current, s.Latest)
	}
	return nil
}

func latestVersion() (int32, error) {
	names, err := migrate.FindMigrations(migrations.FS)
	if err != nil {
		return 0, err
	}
	return int32(len(names)), nil
}

// Hash identifies the embedded migration set; the test harness keys its
// template databases on it so an edited migration never reuses a stale one.
func Hash() string { return hashOf(migrations.FS) }

// hashOf hashes the *.sql files of fsys: names, lengths and bodies.
func hashOf(fsys fs.FS) string {
	names, _ := fs.Glob(fsys, "*.sql")
	sort.Strings(names)
	h := sha256.New()
	for _, name := range names {
		body, _ := fs.ReadFile(fsys, name)
		fmt.Fprintf(h, "%s\x00%d\x00", name, len(body))
		h.Write(body)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
