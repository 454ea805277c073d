package community

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func TestNormalizeHost(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{"", ""},
		{"   ", ""},
		{"Example.COM", "example.com"},
		{"  relay.example.com \t", "relay.example.com"},
		{"example.com:443", "example.com"},
		{"example.com:80", "example.com"},
		{"example.com:8080", "example.com:8080"},
		{"example.com:4430", "example.com:4430"},
		{"example.com:180", "example.com:180"},
		{"example.com.", "example.com"},
		{"example.com..", "example.com."},
		{"example.com.:443", "example.com"},
		{"example.com:443.", "example.com"},
		{"example.com:80.", "example.com"},
		{"example.com.:443.", "example.com."},
		{"127.0.0.1", "localhost"},
		{"127.0.0.1:3000", "localhost:3000"},
		{"127.0.0.1:443", "localhost"},
		{"[::1]", "localhost"},
		{"[::1]:3000", "localhost:3000"},
		{"[::1]:80", "localhost"},
		{"LOCALHOST:3000", "localhost:3000"},
		{"127.0.0.1.example", "127.0.0.1.example"},
		{"127.0.0.10", "127.0.0.10"},
		{"[::1].example", "[::1].example"},
		{"[2001:DB8::1]:8443", "[2001:db8::1]:8443"},
		{"[2001:db8::1]", "[2001:db8::1]"},
		{"10.0.0.1:80", "10.0.0.1"},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, NormalizeHost(tc.in), "NormalizeHost(%q)", tc.in)
		if strings.HasSuffix(tc.want, ".") {
			continue // only one dot is dropped; the schema refuses such hosts
		}
		// Normalizing twice changes nothing, so stored and resolved hosts agree.
		require.Equal(t, tc.want, NormalizeHost(tc.want), "NormalizeHost is not idempotent on %q", tc.want)
	}
}

// A community's host is one a Host header can carry, or the community
// could never be reached while its host stayed reserved.
// Mutations killed: CheckHost always nil (every bad host passes); the
// label character check dropped ("bad host!" passes); the port check
// dropped ("x.example:99999" passes); the normal form unchecked
// ("x.example:443:443" stored as "x.example:443", which a request naming
// it reaches as "x.example").
func TestCheckHost(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{
		"relay.example.com", "relay.example.com:8443", "localhost", "localhost:3000",
		"10.0.0.1", "10.0.0.1:8080", "[2001:db8::1]", "[2001:db8::1]:8443", "xn--bcher-kva.example", "a-b.example", "under_score.internal",
	} {
		require.NoError(t, CheckHost(ok), "%q", ok)
		require.NoError(t, CheckHost(NormalizeHost(ok)), "%q normalized", ok)
	}
	for _, bad := range []string{
		"https://relay.example.com/", "relay.example.com/path", "bad host!", "user@relay.example.com",
		"relay.example.com:99999", "relay.example.com:0", "relay.example.com:", "relay.example.com:x",
		"relay.example.com:08080", "[not-ipv6]", "[10.0.0.1]", "-lead.example", "trail-.example",
		"a..example", ".example", strings.Repeat("a", 64) + ".example",
		"x.example:443:443", "x.example:80:80", "localhost:443:443",
	} {
		require.Error(t, CheckHost(NormalizeHost(bad)), "%q", bad)
	}
}

func TestRelayURLAuthority(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{"wss://Relay.Example.com", "relay.example.com"},
		{"wss://relay.example.com/", "relay.example.com"},
		{"wss://relay.example.com:443/path", "relay.example.com"},
		{"ws://localhost:3000", "localhost:3000"},
		{"ws://127.0.0.1:3000", "localhost:3000"},
		{"ws://[::1]:3000", "localhost:3000"},
		{"wss://[2001:db8::1]:7777", "[2001:db8::1]:7777"},
		{"relay.example.com", ""},
		{"", ""},
		{"://bad", ""},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, RelayURLAuthority(tc.in), "RelayURLAuthority(%q)", tc.in)
	}
}

func TestResolveRejectsUnknownArchivedAndDeletedHosts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	q := db.New(pool)

	live, err := q.CommunityCreate(ctx, "live.example")
	require.NoError(t, err)
	_, err = q.CommunityCreate(ctx, "archived.example")
	require.NoError(t, err)
	_, err = q.CommunityArchive(ctx, db.CommunityArchiveParams{Host: "archived.example"})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO communities (host, deletion_state) VALUES ('fenced.example', 'fenced')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO communities (host, deletion_state, deleted_at) VALUES ('gone.example', 'tombstone', now())`)
	require.NoError(t, err)

	tenant, err := Resolve(ctx, q, NormalizeHost(" LIVE.example:443 "))
	require.NoError(t, err)
	require.Equal(t, live.ID, tenant.ID())
	require.Equal(t, "live.example", tenant.Host())

	// Normalized once: a second trailing dot or default port is not dropped.
	for _, host := range []string{"", "unknown.example", "archived.example", "fenced.example", "gone.example", "live.example:8443", "live.example..", "live.example:443:443"} {
		_, err := Resolve(ctx, q, NormalizeHost(host))
		require.ErrorIs(t, err, ErrUnknownHost, "host %q", host)
	}

	// The operator plane still sees the tombstone, which keeps its host reserved.
	row, err := q.CommunityByHost(ctx, "gone.example")
	require.NoError(t, err)
	require.Equal(t, "tombstone", row.DeletionState)
	_, err = q.CommunityCreate(ctx, "gone.example")
	require.ErrorContains(t, err, "communities_host_key")

	// Unarchiving makes the host resolve again.
	_, err = q.CommunityUnarchive(ctx, "archived.example")
	require.NoError(t, err)
	_, err = Resolve(ctx, q, "archived.example")
	require.NoError(t, err)
}

func TestStoredHostsMustBeNormalized(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := db.New(dbtest.Pool(t))
	for _, host := range []string{"", "Upper.example", " spaced.example", "port.example:443", "port.example:80", "dot.example.", "127.0.0.1:3000", "[::1]"} {
		_, err := q.CommunityCreate(ctx, host)
		require.ErrorContains(t, err, "communities_host_normalized", "host %q", host)
	}
	_, err := q.CommunityCreate(ctx, "ok.example:8443")
	require.NoError(t, err)
}

func TestCommunityEnsureIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := db.New(dbtest.Pool(t))
	first, err := q.CommunityEnsure(ctx, "localhost:3000")
	require.NoError(t, err)
	second, err := q.CommunityEnsure(ctx, "localhost:3000")
	require.NoError(t, err)
	require.Equal(t, first.ID, second.ID)
	list, err := q.CommunityList(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
}

// Two relay processes start at once on a fresh database and both seed
// their community: the one whose insert waits for the other's must still
// get the row. Before, its statement's snapshot predated the other's
// commit, the insert did nothing and the select saw nothing, and serve
// failed with "seed community: no rows in result set".
// Mutation killed: Ensure without its second statement.
func TestCommunityEnsureRacingAnotherStart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := dbtest.Pool(t)
	other, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = other.Rollback(context.Background()) }()
	first, err := db.New(other).CommunityEnsure(ctx, "race.example")
	require.NoError(t, err)

	type result struct {
		row db.CommunityEnsureRow
		err error
	}
	done := make(chan result, 1)
	go func() {
		row, err := Ensure(ctx, db.New(pool), "race.example")
		done <- result{row, err}
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		return pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%CommunityEnsure%')`).Scan(&waiting) == nil && waiting
	}, time.Minute, 10*time.Millisecond, "the second start waits for the first one's insert")
	require.NoError(t, other.Commit(ctx))
	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, first.ID, r.row.ID)
}
