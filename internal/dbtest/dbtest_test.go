package dbtest_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// Two parallel tests each write a marker into their own database; each must
// see only its own, and both databases must be migrated.
func TestParallelTestsGetSeparateDatabases(t *testing.T) {
	var mu sync.Mutex
	names := map[string]string{}
	for _, marker := range []string{"a.example", "b.example"} {
		t.Run(marker, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := dbtest.Pool(t)
			_, err := pool.Exec(ctx, "INSERT INTO communities (host) VALUES ($1)", marker)
			require.NoError(t, err)
			var hosts []string
			rows, err := pool.Query(ctx, "SELECT host FROM communities")
			require.NoError(t, err)
			for rows.Next() {
				var h string
				require.NoError(t, rows.Scan(&h))
				hosts = append(hosts, h)
			}
			require.NoError(t, rows.Err())
			require.Equal(t, []string{marker}, hosts)

			var dbName, zone string
			require.NoError(t, pool.QueryRow(ctx, "SELECT current_database(), current_setting('TimeZone')").Scan(&dbName, &zone))
			require.Equal(t, dbtest.TimeZone, zone)
			mu.Lock()
			names[marker] = dbName
			mu.Unlock()
		})
	}
	t.Cleanup(func() {
		require.Len(t, names, 2)
		require.NotEqual(t, names["a.example"], names["b.example"])
	})
}
