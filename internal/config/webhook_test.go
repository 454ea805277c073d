package config

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/workflow/safehttp"
)

// The call_webhook client's settings: defaults are the client's own, values
// are read, trusted networks accept CIDR prefixes and bare addresses.
// Mutation killed: a setting not wired into FromEnv keeps its default.
func TestWorkflowWebhookSettings(t *testing.T) {
	t.Parallel()
	c, err := FromEnv(env(nil))
	require.NoError(t, err)
	require.Equal(t, safehttp.DefaultTimeout, c.WorkflowWebhookTimeout)
	require.Equal(t, safehttp.DefaultMaxResponseBytes, c.WorkflowWebhookResponseBytes)
	require.Empty(t, c.WorkflowWebhookAllowedNets, "no private network is trusted by default")

	c, err = FromEnv(env(map[string]string{
		"BUZZ_WORKFLOW_WEBHOOK_TIMEOUT":        "2500ms",
		"BUZZ_WORKFLOW_WEBHOOK_RESPONSE_BYTES": "4096",
		"BUZZ_WORKFLOW_WEBHOOK_ALLOWED_NETS":   " 10.20.0.0/16, 127.0.0.1 ,fd00:1::/64",
	}))
	require.NoError(t, err)
	require.Equal(t, 2500*time.Millisecond, c.WorkflowWebhookTimeout)
	require.Equal(t, 4096, c.WorkflowWebhookResponseBytes)
	require.Equal(t, []netip.Prefix{
		netip.MustParsePrefix("10.20.0.0/16"),
		netip.MustParsePrefix("127.0.0.1/32"),
		netip.MustParsePrefix("fd00:1::/64"),
	}, c.WorkflowWebhookAllowedNets)
}

func TestMalformedWorkflowWebhookSettingsNameTheVariable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, value string }{
		{"BUZZ_WORKFLOW_WEBHOOK_ALLOWED_NETS", "10.0.0.0/33"},
		{"BUZZ_WORKFLOW_WEBHOOK_ALLOWED_NETS", "10.0.0.0/8,intranet"},
		{"BUZZ_WORKFLOW_WEBHOOK_ALLOWED_NETS", "10.0.0.0/8,,"},
		{"BUZZ_WORKFLOW_WEBHOOK_TIMEOUT", "10"},
		{"BUZZ_WORKFLOW_WEBHOOK_TIMEOUT", "0s"},
		{"BUZZ_WORKFLOW_WEBHOOK_RESPONSE_BYTES", "0"},
		{"BUZZ_WORKFLOW_WEBHOOK_RESPONSE_BYTES", "1MiB"},
	} {
		_, err := FromEnv(env(map[string]string{tc.name: tc.value}))
		require.ErrorContains(t, err, tc.name+"=", "%s=%q", tc.name, tc.value)
	}
}
