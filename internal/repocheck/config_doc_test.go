package repocheck

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/deletion"
	"github.com/buzzrelay/buzz/internal/outbox"
)

// settingReaders are the server's readers of environment variables, each
// called with a getenv that records what it asks. (The dev-only variables
// are read in cmd/buzz-relay; devSettingsSource names them.)
var settingReaders = map[string]func(getenv func(string) string) (any, error){
	"config.FromEnv":         func(g func(string) string) (any, error) { return config.FromEnv(g) },
	"outbox.ConfigFromEnv":   func(g func(string) string) (any, error) { return outbox.ConfigFromEnv(g) },
	"deletion.ConfigFromEnv": func(g func(string) string) (any, error) { return deletion.ConfigFromEnv(g) },
}

// devSettingsSource reads `buzz-relay dev`'s own variables.
const devSettingsSource = "../../cmd/buzz-relay/main.go"

// undocumentedSettings are read but deliberately absent from the
// configuration tables, each for the reason given.
var undocumentedSettings = map[string]string{
	"BUZZ_REPLICA_HEAD_MAX_AGE_SECS":        "retired: setting it is a start-up error naming its replacement",
	"BUZZ_MAX_CONTENT_BYTES":                "retired: setting it is a start-up error naming its replacement (BUZZ_MAX_CONTENT_LENGTH)",
	"BUZZ_DELETION_TEST_PAUSE_BEFORE_STAMP": "a crash test's pause point, never an operator's setting",
}

var (
	settingName  = regexp.MustCompile("`((?:BUZZ|RELAY)_[A-Z0-9_]+)`")
	tableRow     = regexp.MustCompile(`(?m)^\| (.+?) \| (.+?) \| .*\|$`)
	backtickedAt = regexp.MustCompile("^`([^`]*)`")
)

// documentedSetting is one row of the README's configuration tables.
type documentedSetting struct {
	names      []string
	defaultVal string // the default cell
}

// readmeSettings parses the tables of the README's "## Configuration"
// section (the server's settings; the CLIs' follow under "## Commands").
func readmeSettings(t *testing.T) []documentedSetting {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(readme), "\n## Configuration\n")
	require.True(t, ok, "README.md has a Configuration section")
	section, _, ok = strings.Cut(section, "\n## ")
	require.True(t, ok)
	var rows []documentedSetting
	for _, m := range tableRow.FindAllStringSubmatch(section, -1) {
		var names []string
		for _, n := range settingName.FindAllStringSubmatch(m[1], -1) {
			names = append(names, n[1])
		}
		if len(names) > 0 {
			rows = append(rows, documentedSetting{names: names, defaultVal: m[2]})
		}
	}
	require.NotEmpty(t, rows)
	return rows
}

// recordingGetenv answers from vars and records every name asked.
type recordingGetenv struct {
	mu    sync.Mutex
	asked map[string]bool
	vars  map[string]string
}

func (r *recordingGetenv) get(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.asked == nil {
		r.asked = map[string]bool{}
	}
	r.asked[name] = true
	return r.vars[name]
}

// Every variable the server reads is in the README's configuration
// tables, and every variable those tables list is read: an operator
// never sets a documented variable that nothing reads, nor misses one.
// Mutations killed: a row dropped from a table; a variable renamed in
// the code or the README.
func TestReadmeConfigurationTablesListWhatTheServerReads(t *testing.T) {
	t.Parallel()
	documented := map[string]bool{}
	for _, row := range readmeSettings(t) {
		for _, n := range row.names {
			documented[n] = true
		}
	}

	read := map[string]string{} // name -> reader
	for reader, fromEnv := range settingReaders {
		rec := &recordingGetenv{}
		_, err := fromEnv(rec.get)
		require.NoError(t, err, reader)
		for n := range rec.asked {
			read[n] = reader
		}
	}
	dev, err := os.ReadFile(devSettingsSource)
	require.NoError(t, err)
	for _, m := range regexp.MustCompile(`getenv\("(BUZZ_DEV_[A-Z0-9_]+)"\)`).FindAllStringSubmatch(string(dev), -1) {
		read[m[1]] = devSettingsSource
	}
	require.Contains(t, read, "BUZZ_DEV_PG_PORT", "the dev settings are still read in %s", devSettingsSource)

	var undocumented, unread []string
	for n, reader := range read {
		if _, deliberately := undocumentedSettings[n]; !documented[n] && !deliberately {
			undocumented = append(undocumented, n+" (read by "+reader+")")
		}
	}
	for n := range documented {
		if _, ok := read[n]; !ok {
			unread = append(unread, n)
		}
	}
	for n := range undocumentedSettings {
		require.Contains(t, read, n, "undocumentedSettings names a variable nothing reads any more")
	}
	slices.Sort(undocumented)
	slices.Sort(unread)
	require.Empty(t, undocumented, "read by the server but missing from the README's configuration tables")
	require.Empty(t, unread, "listed in the README's configuration tables but read by nothing")
}

// documentedDefault is the value a default cell states, or "" when the
// cell describes an unset variable ("(none)", "(off)", "(unset: ...)") or
// names another variable. A leading backticked value wins; a trailing
// parenthetical ("720h (30 days)") is a gloss.
func documentedDefault(cell string) string {
	if m := backtickedAt.FindStringSubmatch(cell); m != nil {
		if settingName.MatchString("`" + m[1] + "`") {
			return ""
		}
		return m[1]
	}
	if strings.HasPrefix(cell, "(") {
		return ""
	}
	if i := strings.Index(cell, " ("); i >= 0 {
		cell = cell[:i]
	}
	return strings.TrimSpace(cell)
}

// Setting a variable to the default the README states changes nothing:
// the documented default is the real one, in the unit the code reads.
// Mutations killed: a default changed in the code and not in the README
// (or the other way round); a unit documented wrongly (5000 for a
// variable read in seconds).
func TestReadmeConfigurationDefaultsAreTheDefaults(t *testing.T) {
	t.Parallel()
	checked := 0
	for _, row := range readmeSettings(t) {
		if len(row.names) != 1 {
			continue // a shared row states its defaults in prose
		}
		name, value := row.names[0], documentedDefault(row.defaultVal)
		if value == "" {
			continue
		}
		for reader, fromEnv := range settingReaders {
			rec := &recordingGetenv{}
			unset, err := fromEnv(rec.get)
			require.NoError(t, err)
			if !rec.asked[name] {
				continue
			}
			set, err := fromEnv((&recordingGetenv{vars: map[string]string{name: value}}).get)
			require.NoError(t, err, "%s=%q, the README's default, is refused by %s", name, value, reader)
			require.Equal(t, unset, set, "%s=%q, the README's default, is not %s's default", name, value, reader)
			checked++
		}
	}
	require.Greater(t, checked, 60, "most rows state a default")
}

var (
	// proseDefault is a default stated beside a setting in prose:
	// "`BUZZ_X` (30 s)", "(`BUZZ_X`, 150 ms)", "`BUZZ_X` (default 1,000)".
	// A value that is not the default ("16 x `BUZZ_MEDIA_MAX_BYTES` (1.6 GiB
	// at the defaults)") is followed by other words and does not match.
	proseDefault = regexp.MustCompile("`((?:BUZZ|RELAY)_[A-Z0-9_]+)`(?: \\(|, )(?:default )?([0-9][0-9,]*)(?: ?(ms|s|min|h|days|KiB|MiB|GiB))?(?:\\)|, | by default\\)| per )")
	// docTableDefault is a doc's own settings table: "| `BUZZ_X` | 150 |".
	docTableDefault = regexp.MustCompile("(?m)^\\| `((?:BUZZ|RELAY)_[A-Z0-9_]+)` \\| ([0-9][0-9,]*)(?: \\(| \\|)()")
)

// settingValue is what an operator would set to get the documented
// number and unit, in the form the variable is read: whole milliseconds
// for _MS, whole seconds for _SECS, bytes for a size, a Go duration for
// any other time.
func settingValue(name, number, unit string) string {
	n, err := strconv.ParseInt(strings.ReplaceAll(number, ",", ""), 10, 64)
	if err != nil {
		return number
	}
	var d time.Duration
	switch unit {
	case "":
		return strconv.FormatInt(n, 10)
	case "KiB":
		return strconv.FormatInt(n<<10, 10)
	case "MiB":
		return strconv.FormatInt(n<<20, 10)
	case "GiB":
		return strconv.FormatInt(n<<30, 10)
	case "ms":
		d = time.Duration(n) * time.Millisecond
	case "s":
		d = time.Duration(n) * time.Second
	case "min":
		d = time.Duration(n) * time.Minute
	case "h":
		d = time.Duration(n) * time.Hour
	case "days":
		d = time.Duration(n) * 24 * time.Hour
	}
	switch {
	case strings.HasSuffix(name, "_MS"):
		return strconv.FormatInt(d.Milliseconds(), 10)
	case strings.HasSuffix(name, "_SECS"):
		return strconv.FormatInt(int64(d/time.Second), 10)
	}
	return d.String()
}

// The defaults docs/*.md state beside a setting in prose or in their own
// tables are the server's defaults too, in the unit stated: the README's
// table is not the only place a reader takes a number from.
// Mutations killed: a default changed in the code and left in a doc
// ("`BUZZ_WORKFLOW_POLL` (1 s)" once the poll is 2 s); a doc's number or
// unit written wrongly ("`BUZZ_OPERATOR_LISTENER_POLL_MS` (2 ms)").
func TestDocsStateTheServersDefaults(t *testing.T) {
	t.Parallel()
	docs, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	var wrong []string
	checked := 0
	for _, path := range append(docs, "../../README.md") {
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		text := strings.Join(strings.Fields(string(raw)), " ") // a claim may wrap lines
		claims := proseDefault.FindAllStringSubmatch(text, -1)
		claims = append(claims, docTableDefault.FindAllStringSubmatch(string(raw), -1)...)
		for _, m := range claims {
			name, value := m[1], settingValue(m[1], m[2], m[3])
			for reader, fromEnv := range settingReaders {
				rec := &recordingGetenv{}
				unset, err := fromEnv(rec.get)
				require.NoError(t, err)
				if !rec.asked[name] {
					continue
				}
				checked++
				set, err := fromEnv((&recordingGetenv{vars: map[string]string{name: value}}).get)
				if err != nil || !reflect.DeepEqual(unset, set) {
					wrong = append(wrong, fmt.Sprintf("%s: %s says %s %s (%s=%s), not %s's default",
						filepath.Base(path), name, m[2], m[3], name, value, reader))
				}
			}
		}
	}
	require.Greater(t, checked, 60, "the docs' stated defaults are still found")
	slices.Sort(wrong)
	require.Empty(t, slices.Compact(wrong))
}

// Every setting docs/*.md name is one the code reads: the server's readers,
// or a literal a command or the test harness looks up. A doc never tells an
// operator to set a variable nothing reads.
// Mutation killed: a variable renamed in the code and left in a doc
// (BUZZ_ACP_CATCHUP_LIMIT renamed in cmd/buzz-acp).
func TestDocsNameSettingsTheCodeReads(t *testing.T) {
	t.Parallel()
	read := map[string]bool{}
	for _, fromEnv := range settingReaders {
		rec := &recordingGetenv{}
		_, err := fromEnv(rec.get)
		require.NoError(t, err)
		for n := range rec.asked {
			read[n] = true
		}
	}
	literal := regexp.MustCompile(`"((?:BUZZ|RELAY)_[A-Z0-9_]+)"`)
	for _, dir := range []string{"../../cmd", "../../internal"} {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range literal.FindAllStringSubmatch(string(src), -1) {
				read[m[1]] = true
			}
			return nil
		})
		require.NoError(t, err)
	}
	docs, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	mention := regexp.MustCompile(`\b(?:BUZZ|RELAY)_[A-Z0-9_]*[A-Z0-9]\b`)
	var unread []string
	for _, path := range docs {
		text, err := os.ReadFile(path)
		require.NoError(t, err)
		for _, name := range mention.FindAllString(string(text), -1) {
			if !read[name] {
				unread = append(unread, name+" ("+filepath.Base(path)+")")
			}
		}
	}
	slices.Sort(unread)
	require.Empty(t, slices.Compact(unread), "docs name settings nothing reads")
}
