package pgsession_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/pgsession"
	"github.com/buzzrelay/buzz/internal/pguuid"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// A session is named by the program unless the URL names it, as a
// parameter or in options. Read back from pg_stat_activity through a real
// pool.
// Mutations killed: Name emptied (the session's name is ""); Name setting
// the name over the URL's (the URL cases read "buzz-relay").
func TestNameUnlessTheURLNames(t *testing.T) {
	t.Parallel()
	base := dbtest.URL(t)
	for _, tc := range []struct {
		name  string
		query url.Values
		want  string
	}{
		{"named by the program", nil, pgsession.Relay},
		{"the URL's parameter", url.Values{"application_name": {"pod-7"}}, "pod-7"},
		{"the URL's options", url.Values{"options": {"-c application_name=pod-8"}}, "pod-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, err := url.Parse(base)
			require.NoError(t, err)
			q := u.Query()
			for k, v := range tc.query {
				q[k] = v
			}
			u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
			cfg, err := pguuid.ParsePoolConfig(u.String())
			require.NoError(t, err)
			pgsession.Name(&cfg.ConnConfig.Config, pgsession.Relay)
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(t, err)
			defer pool.Close()
			require.Equal(t, tc.want, dbtest.SessionName(t, pool))
		})
	}
}
