// Package pgsession names the PostgreSQL sessions of the relay and its
// tools, so pg_stat_activity tells each program's backends apart: the relay's
// writer pool from its standby readers, buzz-admin's, the migrator's and
// an operator's psql. That is how an operator counts a relay's sessions
// against BUZZ_DB_MAX_CONNS, or finds who holds a lock.
package pgsession

import (
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// The application_name of each program's sessions.
const (
	Relay   = "buzz-relay"        // buzz-relay serve's writer pool
	Reader  = "buzz-relay-reader" // its pools on the standby (BUZZ_READ_DATABASE_URL)
	Admin   = "buzz-admin"
	Migrate = "buzz-migrate" // buzz-relay migrate (and dev's migration)
)

// Name gives every session of cfg the application_name name, unless the
// URL set one (as a parameter or in options): the operator's name wins.
func Name(cfg *pgconn.Config, name string) {
	if _, set := cfg.RuntimeParams["application_name"]; set {
		return
	}
	if options := cfg.RuntimeParams["options"]; strings.Contains(options, "application_name") ||
		strings.Contains(options, "application-name") {
		return
	}
	cfg.RuntimeParams["application_name"] = name
}
