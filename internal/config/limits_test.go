package config

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPerClientBoundsAreRead(t *testing.T) {
	t.Parallel()
	c, err := FromEnv(env(map[string]string{
		"BUZZ_AUTH_TIMEOUT":                "5s",
		"BUZZ_MAX_CONNECTIONS":             "10",
		"BUZZ_MAX_CONNECTIONS_PER_ADDRESS": "2",
		"BUZZ_HANDSHAKES_PER_SECOND":       "3",
		"BUZZ_MAX_FILTER_VALUES":           "300",
		"BUZZ_PUBLISH_PER_MINUTE":          "30",
		"BUZZ_PUBLISH_BURST":               "5",
		"BUZZ_MESSAGES_PER_SECOND":         "7",
		"BUZZ_RATE_LIMIT_KEYS":             "1000",
		"BUZZ_REQ_PAGE_ROWS":               "50",
		"BUZZ_REPLY_QUEUE_BYTES":           "65536",
		"BUZZ_HTTP_READ_TIMEOUT":           "7s",
		"BUZZ_HTTP_WRITE_TIMEOUT":          "8s",
		"BUZZ_HTTP_IDLE_TIMEOUT":           "9s",
		"BUZZ_METRICS_ADDR":                "10.0.0.5:9464",
		"BUZZ_TRUSTED_PROXIES":             "10.0.0.0/8, 192.0.2.7,::1",
	}))
	require.NoError(t, err)
	require.Equal(t, 5*time.Second, c.AuthTimeout)
	require.Equal(t, 10, c.MaxConnections)
	require.Equal(t, 2, c.MaxConnectionsPerAddr)
	require.Equal(t, 3, c.HandshakesPerSecond)
	require.Equal(t, 300, c.MaxFilterValues)
	require.Equal(t, 30, c.PublishPerMinute)
	require.Equal(t, 5, c.PublishBurst)
	require.Equal(t, 7, c.MessagesPerSecond)
	require.Equal(t, 1000, c.RateLimitKeys)
	require.Equal(t, 50, c.ReqPageRows)
	require.Equal(t, 65536, c.ReplyQueueBytes)
	require.Equal(t, 7*time.Second, c.HTTPReadTimeout)
	require.Equal(t, 8*time.Second, c.HTTPWriteTimeout)
	require.Equal(t, 9*time.Second, c.HTTPIdleTimeout)
	require.Equal(t, "10.0.0.5:9464", c.MetricsAddr)
	require.Equal(t, []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32"), netip.MustParsePrefix("::1/128"),
	}, c.TrustedProxies)
}

// Metrics stay on loopback and no proxy is trusted unless configured.
func TestPerClientBoundDefaults(t *testing.T) {
	t.Parallel()
	c := Default()
	require.Equal(t, "127.0.0.1:9464", c.MetricsAddr)
	require.Empty(t, c.TrustedProxies)
	require.Positive(t, c.AuthTimeout)
}

func TestMalformedPerClientBoundsNameTheVariable(t *testing.T) {
	t.Parallel()
	for name, value := range map[string]string{
		"BUZZ_TRUSTED_PROXIES":             "10.0.0.0/8,proxy.internal",
		"BUZZ_AUTH_TIMEOUT":                "30",
		"BUZZ_MAX_CONNECTIONS_PER_ADDRESS": "0",
		"BUZZ_HANDSHAKES_PER_SECOND":       "0",
		"BUZZ_PUBLISH_PER_MINUTE":          "-3",
	} {
		_, err := FromEnv(env(map[string]string{name: value}))
		require.ErrorContains(t, err, name, "%s=%q", name, value)
	}
}

// The old byte-counted content limit stops start-up, naming its
// replacement, which counts characters. Mutation killed: reading the old
// name no more (its value silently ignored).
func TestOldMaxContentBytesIsAStartUpError(t *testing.T) {
	t.Parallel()
	_, err := FromEnv(env(map[string]string{"BUZZ_MAX_CONTENT_BYTES": "1000"}))
	require.ErrorContains(t, err, "BUZZ_MAX_CONTENT_LENGTH")
	c, err := FromEnv(env(map[string]string{"BUZZ_MAX_CONTENT_LENGTH": "1000"}))
	require.NoError(t, err)
	require.Equal(t, 1000, c.MaxContentLength)
}
