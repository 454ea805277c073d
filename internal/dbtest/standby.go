package dbtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/buzzrelay/buzz/internal/migrate"
	"github.com/buzzrelay/buzz/internal/pgcluster"
)

// StandbyURLEnv names the variable holding the admin URL of the test
// cluster's streaming standby.
const StandbyURLEnv = "BUZZ_TEST_PG_STANDBY_URL"

// StandbySettings are the test standbys' postgresql.conf extras. A replay
// that conflicts with a standby query waits at most this long before the
// query is cancelled, so one test's long read cannot hold replay back for
// everyone for the default 30 s.
var StandbySettings = map[string]string{"max_standby_streaming_delay": "'2s'"}

var (
	standbyMu      sync.Mutex
	standbyURL     string
	standbyPrivate *pgcluster.Cluster // started by this process: stopped when Main returns
)

// StandbyAdminURL is the admin URL of the test run's shared streaming
// standby: the one the wrapper (withcluster) started, else one this test
// process makes from its cluster on first use. Tests share it, so none may
// pause its replay or stop it: those take a PrivatePair.
func StandbyAdminURL(t testing.TB) string {
	t.Helper()
	standbyMu.Lock()
	defer standbyMu.Unlock()
	if standbyURL == "" {
		standbyURL = os.Getenv(StandbyURLEnv)
	}
	if standbyURL == "" {
		port, err := portOf(adminURL)
		if err != nil {
			t.Fatalf("dbtest: %v", err)
		}
		c, err := pgcluster.StartStandbyOf(context.Background(), port, StandbySettings)
		if err != nil {
			t.Fatalf("dbtest: %s is unset and no standby could be made: %v", StandbyURLEnv, err)
		}
		standbyPrivate, standbyURL = c, c.URL("postgres")
	}
	return standbyURL
}

func stopPrivateStandby() {
	standbyMu.Lock()
	defer standbyMu.Unlock()
	if standbyPrivate != nil {
		standbyPrivate.Close()
		standbyPrivate = nil
	}
}

func portOf(rawURL string) (int, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(u.Port())
}

// ReaderURL returns the URL of writerURL's database on the shared standby
// once the standby has replayed its creation and migrations (so the
// heartbeat row is there to read).
func ReaderURL(t testing.TB, writerURL string) string {
	t.Helper()
	return readerURLOn(t, StandbyAdminURL(t), writerURL)
}

func readerURLOn(t testing.TB, standbyAdmin, writerURL string) string {
	t.Helper()
	w, err := url.Parse(writerURL)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	s, err := url.Parse(standbyAdmin)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	w.Host = s.Host
	reader := w.String()
	WaitReplayed(t, writerURL, reader)
	return reader
}

// WaitReplayed waits (a generous minute) until the standby behind reader
// has replayed everything the writer had inserted into its WAL when it was
// called. The insert position, not the write position: a transaction
// committed without waiting for its flush (synchronous_commit off) may not
// be written out yet, and the standby must still replay it.
func WaitReplayed(t testing.TB, writer, reader string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wc, err := pgx.Connect(ctx, writer)
	if err != nil {
		t.Fatalf("dbtest: connect to writer: %v", err)
	}
	defer wc.Close(context.Background())
	var lsn string
	if err := wc.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
		t.Fatalf("dbtest: writer lsn: %v", err)
	}
	for {
		rc, err := pgx.Connect(ctx, reader)
		if err == nil {
			var done bool
			err = rc.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn).Scan(&done)
			rc.Close(context.Background())
			if err == nil && done {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("dbtest: the standby did not replay %s in time: %v", lsn, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Pair is a primary and its streaming standby of a test's own, for tests
// that pause replay or stop the standby. Both stop when the test ends.
type Pair struct {
	Primary, Standby *pgcluster.Cluster
	// WriterURL and ReaderURL name one migrated database on each.
	WriterURL, ReaderURL string
}

// PrivatePair starts a fresh primary with one migrated database and a
// standby of it.
func PrivatePair(t testing.TB) *Pair {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary, err := pgcluster.StartTemp(ctx, ClusterSettings)
	if err != nil {
		t.Fatalf("dbtest: private primary: %v", err)
	}
	t.Cleanup(func() { primary.Close() })
	admin, err := pgx.Connect(ctx, primary.URL("postgres"))
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	_, err = admin.Exec(ctx, "CREATE DATABASE buzz")
	admin.Close(ctx)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	conn, err := pgx.Connect(ctx, primary.URL("buzz"))
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	err = migrate.Up(ctx, conn)
	conn.Close(ctx)
	if err != nil {
		t.Fatalf("dbtest: migrate: %v", err)
	}
	standby, err := pgcluster.StartStandby(ctx, primary, map[string]string{"max_standby_streaming_delay": "'100ms'"})
	if err != nil {
		t.Fatalf("dbtest: private standby: %v", err)
	}
	t.Cleanup(func() { standby.Close() })
	p := &Pair{Primary: primary, Standby: standby,
		WriterURL: withTimeZone(primary.URL("buzz")), ReaderURL: withTimeZone(standby.URL("buzz"))}
	WaitReplayed(t, p.WriterURL, p.ReaderURL)
	return p
}

func withTimeZone(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		panic(fmt.Sprint("dbtest: ", err))
	}
	q := u.Query()
	q.Set("timezone", TimeZone)
	u.RawQuery = q.Encode()
	return u.String()
}
