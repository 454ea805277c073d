// Package migrations embeds the tern migrations, the only runtime DDL truth.
// Run them with `buzz-relay migrate` (see internal/migrate for why only one
// process migrates).
package migrations

import "embed"

// FS holds every NNN_name.sql migration, in tern's format.
//
//go:embed *.sql
var FS embed.FS
