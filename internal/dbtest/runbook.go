package dbtest

import (
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/buzzrelay/buzz/internal/pgcluster"
)

// PsqlPath is the psql a test runs an operator's SQL with, as the
// operator would.
func PsqlPath(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("psql"); err == nil {
		return p
	}
	dir, err := pgcluster.FindBinaries()
	if err != nil {
		t.Fatalf("dbtest: psql: %v", err)
	}
	p := filepath.Join(dir, "psql")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("dbtest: psql is installed with the PostgreSQL server binaries: %v", err)
	}
	return p
}

// PsqlURL is a test database's URL as libpq takes it: without the
// timezone parameter pgx accepts and libpq refuses.
func PsqlURL(t testing.TB, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	q := u.Query()
	q.Del("timezone")
	u.RawQuery = q.Encode()
	return u.String()
}

// SQLBlock is the ```sql block of a markdown file whose first line is
// firstLine: the text an operator copies from the doc, so a test runs the
// doc itself and the two cannot drift apart.
func SQLBlock(t testing.TB, markdownPath, firstLine string) string {
	t.Helper()
	doc, err := os.ReadFile(markdownPath)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	for _, block := range strings.Split(string(doc), "```sql\n")[1:] {
		body, _, closed := strings.Cut(block, "\n```")
		if !closed {
			t.Fatalf("dbtest: an unclosed sql block in %s", markdownPath)
		}
		if strings.HasPrefix(body, firstLine+"\n") {
			return body + "\n"
		}
	}
	t.Fatalf("dbtest: %s has no sql block starting %q", markdownPath, firstLine)
	return ""
}
