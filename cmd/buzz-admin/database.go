package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/buzzrelay/buzz/internal/migrate"
)

// checkDatabase refuses a database this build cannot safely work on,
// before any command statement runs. A schema behind the build lacks the
// rules later migrations added (from 028 on the approval function refuses
// a requester approving their own deletion; before it, nothing does), so
// a command would get past them or fail halfway on a missing function; a
// schema ahead of it may mean something this build does not know. A
// command that writes needs the primary: on a standby or a read-only
// session it would fail at its first write with the server's "read-only
// transaction", which names neither the cause nor the fix.
func checkDatabase(ctx context.Context, conn *pgx.Conn, writes bool) error {
	st, err := migrate.CurrentStatus(ctx, conn)
	if err != nil {
		return fmt.Errorf("read the schema version: %w", err)
	}
	if st.Current == 0 {
		// Most likely the URL names another database (postgres, a typo):
		// "run migrate" would have the operator create the schema there.
		return errors.New("BUZZ_DATABASE_URL names a database with no buzz schema (no migration applied): check the database name; migrate it only if it is meant to be the relays' (`buzz-relay migrate`)")
	}
	if st.Current > st.Latest {
		// RequireCurrent would say "deploy the newer relay": the relays
		// that migrated it are running, this CLI is the old one.
		return fmt.Errorf("BUZZ_DATABASE_URL: database schema is at version %d, newer than this buzz-admin knows (%d): use the buzz-admin of the release that migrated it", st.Current, st.Latest)
	}
	if err := st.RequireCurrent(); err != nil {
		return fmt.Errorf("BUZZ_DATABASE_URL: %w", err)
	}
	if !writes {
		return nil
	}
	var standby, readOnly bool
	if err := conn.QueryRow(ctx, `-- name: AdminDatabaseTakesWrites
		SELECT pg_is_in_recovery(), current_setting('transaction_read_only')::boolean`).Scan(&standby, &readOnly); err != nil {
		return fmt.Errorf("check that the database takes writes: %w", err)
	}
	switch {
	case standby:
		return errors.New("BUZZ_DATABASE_URL names a standby (in recovery), and this command writes: point it at the primary (the relays' BUZZ_DATABASE_URL, not BUZZ_READ_DATABASE_URL)")
	case readOnly:
		return errors.New("BUZZ_DATABASE_URL opens read-only sessions (default_transaction_read_only is on for this role, database or URL), and this command writes: use a role or URL that can write")
	}
	return nil
}

// checkPool is checkDatabase on one of pool's connections.
func checkPool(ctx context.Context, pool *pgxpool.Pool, writes bool) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return connectError(pool.Config().ConnConfig.ConnectTimeout, err)
	}
	defer conn.Release()
	return checkDatabase(ctx, conn.Conn(), writes)
}
