package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nipoa"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// Bad settings stop buzz-acp at start with a message naming the setting.
// Mutation killed: accepting an auth tag without checking it was signed for
// this agent (the "not for this agent" row).
func TestSettingsAreChecked(t *testing.T) {
	t.Parallel()
	agent := relaytest.NewKey(t)
	owner := relaytest.NewKey(t)
	other := relaytest.NewKey(t)
	good, err := nipoa.Sign(owner, agent.PublicKeyHex(), "")
	require.NoError(t, err)
	forOther, err := nipoa.Sign(owner, other.PublicKeyHex(), "")
	require.NoError(t, err)
	tagJSON := func(a *nipoa.Attestation) string {
		b, err := json.Marshal(a.Tag())
		require.NoError(t, err)
		return string(b)
	}
	base := map[string]string{"BUZZ_RELAY_URL": "ws://127.0.0.1:1", "BUZZ_PRIVATE_KEY": agent.Hex(), "BUZZ_ACP_AGENT": "agent --acp"}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"no relay", map[string]string{"BUZZ_RELAY_URL": ""}, nil, "BUZZ_RELAY_URL"},
		{"http relay", map[string]string{"BUZZ_RELAY_URL": "http://x"}, nil, "BUZZ_RELAY_URL"},
		{"no key", map[string]string{"BUZZ_PRIVATE_KEY": ""}, nil, "BUZZ_PRIVATE_KEY"},
		{"bad key", map[string]string{"BUZZ_PRIVATE_KEY": "nsec1abc"}, nil, "BUZZ_PRIVATE_KEY: not a 64-hex secret key"},
		{"malformed auth tag", map[string]string{"BUZZ_AUTH_TAG": `["auth","x"]`}, nil, "BUZZ_AUTH_TAG: malformed auth tag"},
		{"auth tag for another agent", map[string]string{"BUZZ_AUTH_TAG": tagJSON(forOther)}, nil, "BUZZ_AUTH_TAG: auth tag rejected"},
		{"no agent", map[string]string{"BUZZ_ACP_AGENT": ""}, nil, "no agent command"},
		{"bad duration", map[string]string{"BUZZ_ACP_BACKOFF_MIN": "soon"}, nil, "BUZZ_ACP_BACKOFF_MIN"},
		{"backoff upside down", map[string]string{"BUZZ_ACP_BACKOFF_MAX": "1ms"}, nil, "BUZZ_ACP_BACKOFF_MAX"},
		{"bad queue", map[string]string{"BUZZ_ACP_SESSION_QUEUE": "0"}, nil, "BUZZ_ACP_SESSION_QUEUE"},
		{"bad incoming queue", map[string]string{"BUZZ_ACP_INCOMING_QUEUE": "x"}, nil, "BUZZ_ACP_INCOMING_QUEUE"},
		{"bad relay pubkey", map[string]string{"BUZZ_RELAY_PUBKEY": "abc"}, nil, "BUZZ_RELAY_PUBKEY"},
		{"unknown flag", nil, []string{"--nope"}, "flag provided but not defined"},
	} {
		env := func(k string) string {
			if v, ok := tc.env[k]; ok {
				return v
			}
			return base[k]
		}
		_, _, err := parseSettings(tc.args, env)
		require.Error(t, err, tc.name)
		require.Contains(t, err.Error(), tc.want, tc.name)
	}

	env := func(k string) string {
		if k == "BUZZ_AUTH_TAG" {
			return tagJSON(good)
		}
		return base[k]
	}
	cfg, _, err := parseSettings([]string{"--", "my-agent", "--flag"}, env)
	require.NoError(t, err)
	require.Equal(t, []string{"my-agent", "--flag"}, cfg.AgentCommand, "the command after -- wins over BUZZ_ACP_AGENT")
	require.Equal(t, good.Tag(), cfg.AuthTag)
}

// --help prints the usage on stdout and succeeds; a command line that
// cannot run says why, with the usage, on stderr and exits 2; a bad setting
// is a logged failure (1). --help used to end as a logged error, the usage
// escaped into one log line, with status 1.
// Mutations killed: the flag.ErrHelp case removed (help exits 2 on
// stderr); usage errors no longer marked (they exit 1, without the usage).
func TestHelpAndUsageErrorsExitLikeACommand(t *testing.T) {
	t.Parallel()
	env := map[string]string{"BUZZ_RELAY_URL": "ws://127.0.0.1:1", "BUZZ_PRIVATE_KEY": relaytest.NewKey(t).Hex()}
	for _, tc := range []struct {
		args   []string
		env    map[string]string
		code   int
		stdout string
		stderr string
	}{
		{[]string{"--help"}, env, 0, "BUZZ_ACP_MAX_SESSIONS", ""},
		{[]string{"-h"}, env, 0, "buzz-acp [flags] -- AGENT_COMMAND", ""},
		{[]string{"--nope", "--", "agent"}, env, 2, "", "flag provided but not defined: -nope\nbuzz-acp [flags]"},
		{nil, env, 2, "", "no agent command: give it after -- or in BUZZ_ACP_AGENT\nbuzz-acp [flags]"},
		{[]string{"--", "agent"}, map[string]string{"BUZZ_RELAY_URL": "ws://127.0.0.1:1", "BUZZ_PRIVATE_KEY": "zz"}, 1, "", ""},
	} {
		var stdout, stderr, logged bytes.Buffer
		log := slog.New(slog.NewTextHandler(&logged, nil))
		err := run(t.Context(), tc.args, func(k string) string { return tc.env[k] }, &stdout, log)
		require.Equal(t, tc.code, exitStatus(err, &stdout, &stderr, log), "%v", tc.args)
		if tc.stdout != "" {
			require.Contains(t, stdout.String(), tc.stdout, "%v", tc.args)
		}
		if tc.stderr != "" {
			require.Contains(t, stderr.String(), tc.stderr, "%v", tc.args)
		}
		if tc.code == 1 {
			require.Contains(t, logged.String(), "BUZZ_PRIVATE_KEY", "%v: the failure is logged", tc.args)
		}
	}
}

// GET /health: 503 until connected, 200 while connected, and the status
// object either way; other methods get 405 with a JSON error.
func TestHealthEndpoint(t *testing.T) {
	t.Parallel()
	st := newStatus(nil, "ws://relay", "agent")
	get := func(method string) (int, statusLine) {
		rec := httptest.NewRecorder()
		st.ServeHTTP(rec, httptest.NewRequest(method, "/health", nil))
		var s statusLine
		if rec.Code != http.StatusMethodNotAllowed {
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &s))
		}
		return rec.Code, s
	}
	code, s := get(http.MethodGet)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "starting", s.State)
	st.connected(3)
	st.dropped("not_relay_signed")
	code, s = get(http.MethodGet)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, 3, s.Channels)
	require.EqualValues(t, 1, s.Dropped["not_relay_signed"])
	st.disconnected(nil)
	code, _ = get(http.MethodGet)
	require.Equal(t, http.StatusServiceUnavailable, code)
	code, _ = get(http.MethodPost)
	require.Equal(t, http.StatusMethodNotAllowed, code)
}

// The real binary: it prints a JSON status line when connected, and on
// SIGTERM stops, says so, and exits 0.
//
// Mutation killed: main without signal handling (context.Background):
// SIGTERM kills the process with no "stopped" line and a non-zero status.
func TestBinaryStatusLinesAndSIGTERM(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	bin := filepath.Join(t.TempDir(), "buzz-acp")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)

	// A second runtime for the same agent, as its own process.
	cmd := exec.Command(bin, "--health", "127.0.0.1:0", "--", stubPath)
	cmd.Env = append(os.Environ(),
		"BUZZ_RELAY_URL=ws://"+w.proxy.addr(),
		"BUZZ_PRIVATE_KEY="+w.agentKey.Hex(),
		"BUZZ_ACP_CWD="+t.TempDir(),
	)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan statusLine, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var s statusLine
			if json.Unmarshal(sc.Bytes(), &s) == nil {
				lines <- s
			}
		}
	}()
	next := func() statusLine {
		select {
		case s, ok := <-lines:
			require.True(t, ok, "stdout ended")
			return s
		case <-time.After(waitLong):
			t.Fatal("no status line")
			return statusLine{}
		}
	}
	s := next()
	require.Equal(t, "connected", s.State)
	require.Equal(t, w.agentKey.PublicKeyHex(), s.Agent)
	require.Equal(t, 1, s.Channels)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, "stopping", next().State)
	require.Equal(t, "stopped", next().State)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "exit status 0 after SIGTERM")
	case <-time.After(waitLong):
		t.Fatal("buzz-acp did not exit after SIGTERM")
	}
}

// The README's table of buzz-acp settings lists exactly the variables
// parseSettings reads, so an operator neither sets one that nothing reads
// nor misses one.
// Mutations killed: a row dropped from the table; a variable renamed in
// parseSettings.
func TestReadmeSettingsTableListsWhatBuzzACPReads(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, table, ok := strings.Cut(string(readme), "Its settings (env vars")
	require.True(t, ok, "README.md has buzz-acp's settings table")
	_, table, _ = strings.Cut(table, "\n\n") // the table follows the sentence
	table, _, _ = strings.Cut(table, "\n\n")
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| (.+?) \\|").FindAllStringSubmatch(table, -1) {
		for _, n := range regexp.MustCompile("`(BUZZ_[A-Z0-9_]+)`").FindAllStringSubmatch(m[1], -1) {
			documented[n[1]] = true
		}
	}
	read := map[string]bool{}
	valid := map[string]string{"BUZZ_RELAY_URL": "ws://127.0.0.1:1", "BUZZ_PRIVATE_KEY": relaytest.NewKey(t).Hex(), "BUZZ_ACP_AGENT": "agent"}
	_, _, err = parseSettings(nil, func(k string) string { read[k] = true; return valid[k] })
	require.NoError(t, err)
	require.Equal(t, read, documented)
}
