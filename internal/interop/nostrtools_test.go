package interop

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/relaytest"
)

// nostrToolsChecks are the checks js/interop.test.mjs must report as passed.
var nostrToolsChecks = []string{
	"auth-required",
	"publish-subscribe",
	"live-subscription",
	"ephemeral",
	"count",
	"replaceable",
	"addressable",
	"deletion",
	"oversized",
	"versions-and-limits",
}

// TestNostrTools runs js/interop.test.mjs (nostr-tools on node) against a
// real relay. It fails, never skips, when node or the npm packages are
// missing: CI installs both.
func TestNostrTools(t *testing.T) {
	t.Parallel()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not on PATH: install nodejs (>= 20.19), then run `make interop-deps`")
	}
	script, err := filepath.Abs(filepath.Join("js", "interop.test.mjs"))
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join("js", "node_modules", "nostr-tools", "package.json")); err != nil {
		t.Fatal("nostr-tools is not installed in internal/interop/js/node_modules: run `make interop-deps`")
	}

	r := relaytest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Dir = filepath.Dir(script)
	cmd.Env = append(os.Environ(), "RELAY_URL="+r.URL)
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	output := "stdout:\n" + stdout.String() + "\nstderr:\n" + stderr.String()
	t.Log(output)
	require.NoError(t, ctx.Err(), "node did not finish within 60 s\n%s", output)
	require.NoError(t, runErr, "node %s failed\n%s", script, output)

	passed := map[string]bool{}
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var res struct {
			Check string `json:"check"`
			OK    bool   `json:"ok"`
			Error string `json:"error"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &res), "script printed a non-JSON line %q", line)
		require.True(t, res.OK, "check %s failed: %s", res.Check, res.Error)
		passed[res.Check] = true
	}
	for _, name := range nostrToolsChecks {
		require.True(t, passed[name], "check %s did not report a pass\n%s", name, output)
	}
}
