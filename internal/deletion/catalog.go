package deletion

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/buzzrelay/buzz/internal/db"
)

// Statements over the catalog functions of the community_deletion
// migration. They read the live catalog, no table of their own, so they
// live here rather than in a per-table query file; each carries its name
// like a generated query.

// ScopedTables are the community-scoped tables the catalog holds now.
func ScopedTables(ctx context.Context, conn db.DBTX) ([]string, error) {
	return names(ctx, conn, "-- name: DeletionScopedTables\nSELECT t::text FROM community_scoped_tables() t")
}

// FencedTables are the tables carrying an enabled write fence.
func FencedTables(ctx context.Context, conn db.DBTX) ([]string, error) {
	return names(ctx, conn, "-- name: DeletionFencedTables\nSELECT t::text FROM community_fenced_tables() t")
}

func names(ctx context.Context, conn db.DBTX, sql string) ([]string, error) {
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// catalogProblem is one reason the catalog is unsafe for deletion.
type catalogProblem struct {
	Table   string
	Problem string
}

func catalogProblems(ctx context.Context, conn db.DBTX) ([]catalogProblem, error) {
	rows, err := conn.Query(ctx, "-- name: DeletionCatalogProblems\nSELECT table_name, problem FROM community_deletion_catalog_problems()")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[catalogProblem])
}

type foreignKey struct {
	Child  string
	Parent string
}

func scopedForeignKeys(ctx context.Context, conn db.DBTX) ([]foreignKey, error) {
	rows, err := conn.Query(ctx, "-- name: DeletionScopedForeignKeys\nSELECT child, parent FROM community_scoped_foreign_keys()")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[foreignKey])
}

// lockSchemaShared holds the schema-destruction lock shared until the
// transaction ends: no migration commits meanwhile.
func lockSchemaShared(ctx context.Context, conn db.DBTX) error {
	_, err := conn.Exec(ctx, "-- name: DeletionSchemaLockShared\nSELECT pg_advisory_xact_lock_shared(community_schema_destruction_lock_key())")
	return err
}
