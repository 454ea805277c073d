package repocheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	// metricDefinition is where a metric gets its name: a collector's opts
	// or a hand-made descriptor.
	metricDefinition = regexp.MustCompile(`(?:Name:\s*|prometheus\.NewDesc\()"(buzz_[a-z0-9_]+)"`)
	metricMention    = regexp.MustCompile(`\bbuzz_[a-z0-9_]+`)
)

// documentedNonMetrics are buzz_ names the docs mention that are not
// metrics the relay serves, each for the reason given.
var documentedNonMetrics = map[string]string{
	"buzz_community_closed":                           "the PostgreSQL NOTIFY channel of closed communities",
	"buzz_connections_closed_community_deleted_total": "the old name of buzz_connections_closed_community_total, named so dashboards can be moved",
}

// definedMetrics are the names the relay's code gives its metrics.
func definedMetrics(t *testing.T) map[string]string {
	t.Helper()
	defined := map[string]string{}
	for _, dir := range []string{"../../internal", "../../cmd"} {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range metricDefinition.FindAllStringSubmatch(string(src), -1) {
				defined[m[1]] = path
			}
			return nil
		})
		require.NoError(t, err)
	}
	require.Contains(t, defined, "buzz_events_rejected_total", "the metric definitions are still found")
	return defined
}

// mentionedMetrics are the buzz_ names in README.md and docs/*.md.
func mentionedMetrics(t *testing.T) map[string]string {
	t.Helper()
	docs, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	mentioned := map[string]string{}
	for _, path := range append(docs, "../../README.md") {
		text, err := os.ReadFile(path)
		require.NoError(t, err)
		for _, name := range metricMention.FindAllString(string(text), -1) {
			mentioned[name] = path
		}
	}
	return mentioned
}

// Every metric the relay serves is named in the docs, so an operator
// looking at /metrics can read what a series means; every metric the docs
// name exists, so an alert written from the docs fires on something.
// Mutations killed: a metric renamed in the code or a doc; a new metric
// without a word in the docs.
func TestMetricsAndDocsNameTheSameSeries(t *testing.T) {
	t.Parallel()
	defined, mentioned := definedMetrics(t), mentionedMetrics(t)
	var undocumented, missing []string
	for name, path := range defined {
		if _, ok := mentioned[name]; !ok {
			undocumented = append(undocumented, name+" ("+path+")")
		}
	}
	for name, path := range mentioned {
		if _, ok := documentedNonMetrics[name]; ok {
			continue
		}
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if _, ok := defined[base]; !ok {
				base = strings.TrimSuffix(base, suffix)
			}
		}
		if _, ok := defined[base]; !ok {
			missing = append(missing, name+" ("+path+")")
		}
	}
	for name := range documentedNonMetrics {
		require.Contains(t, mentioned, name, "documentedNonMetrics names something the docs no longer mention")
	}
	slices.Sort(undocumented)
	slices.Sort(missing)
	require.Empty(t, undocumented, "metrics no doc names (say what each means in README.md or docs/)")
	require.Empty(t, missing, "names the docs give metrics that do not exist")
}
