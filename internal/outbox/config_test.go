package outbox

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	c, err := ConfigFromEnv(envOf(nil))
	require.NoError(t, err)
	require.Empty(t, c.Listeners, "unset means delivery is disabled")
	require.Equal(t, 5*time.Second, c.Timeout)
	require.Equal(t, 2*time.Second, c.IdlePoll)
	require.Empty(t, c.APIOrigin)
}

func TestConfigListeners(t *testing.T) {
	t.Parallel()
	a := strings.Repeat("a", 64)
	b := strings.Repeat("B", 64)
	for name, tc := range map[string]struct {
		value   string
		want    Routes
		wantErr string // every error names the variable and the entry
	}{
		"one": {value: a + ":https://listener.example/hook", want: Routes{a: "https://listener.example/hook"}},
		"split at the first colon, URL keeps its port": {
			value: a + ":https://listener.example:8443/a:b", want: Routes{a: "https://listener.example:8443/a:b"}},
		"trimmed, empty entries skipped, pubkey lowercased": {
			value: " ; " + a + " : https://one.example ;;" + b + ":https://two.example/ ; ",
			want:  Routes{a: "https://one.example", strings.ToLower(b): "https://two.example/"}},
		"only separators": {value: " ; ;", want: Routes{}},
		"no colon":        {value: a, wantErr: `entry 1 ("` + a + `"): want <64-hex pubkey>:<https URL>`},
		"short pubkey": {value: a + ":https://x.example;abc:https://y.example",
			wantErr: `entry 2 ("abc"): pubkey must be 64 hex characters`},
		"non-hex pubkey": {value: strings.Repeat("g", 64) + ":https://x.example", wantErr: "entry 1 (\"ggg"},
		"http scheme":    {value: a + ":http://x.example", wantErr: "entry 1 (\"" + a + "\"): URL scheme must be https"},
		"no host":        {value: a + ":https:///path", wantErr: "URL must have a host"},
		"opaque":         {value: a + ":https:x.example", wantErr: "URL must have a host"},
		"unparsable":     {value: a + ":https://x.example/%zz", wantErr: "URL does not parse"},
		"userinfo":       {value: a + ":https://user:secret@x.example", wantErr: "URL must not contain credentials"},
		"query":          {value: a + ":https://x.example/?token=1", wantErr: "URL must not have a query"},
		"empty query":    {value: a + ":https://x.example/?", wantErr: "URL must not have a query"},
		"fragment":       {value: a + ":https://x.example/#top", wantErr: "URL must not have a fragment"},
		"empty fragment": {value: a + ":https://x.example/#", wantErr: "URL must not have a fragment"},
		"duplicate pubkey, any case": {value: a + ":https://x.example;" + strings.ToUpper(a) + ":https://y.example",
			wantErr: "entry 2 (\"" + a + "\"): duplicate pubkey"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c, err := ConfigFromEnv(envOf(map[string]string{EnvListeners: tc.value}))
			if tc.wantErr != "" {
				require.ErrorContains(t, err, EnvListeners+" ")
				require.ErrorContains(t, err, tc.wantErr)
				require.NotContains(t, err.Error(), "secret", "an entry is named without its URL")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, c.Listeners)
		})
	}
}

func TestConfigTimeout(t *testing.T) {
	t.Parallel()
	for value, want := range map[string]time.Duration{
		"100": 100 * time.Millisecond, "10000": 10 * time.Second, " 2500 ": 2500 * time.Millisecond,
	} {
		c, err := ConfigFromEnv(envOf(map[string]string{EnvTimeout: value}))
		require.NoError(t, err, value)
		require.Equal(t, want, c.Timeout, value)
	}
	for _, value := range []string{"99", "10001", "0", "-5", "5s", "1e3", "abc"} {
		_, err := ConfigFromEnv(envOf(map[string]string{EnvTimeout: value}))
		require.ErrorContains(t, err, EnvTimeout, value)
		require.ErrorContains(t, err, "100..10000", value)
	}
}

func TestConfigKeepWarm(t *testing.T) {
	t.Parallel()
	c, err := ConfigFromEnv(envOf(nil))
	require.NoError(t, err)
	require.Equal(t, DefaultKeepWarm, c.KeepWarm)
	for value, want := range map[string]time.Duration{"0": 0, "1000": time.Second, "3600000": time.Hour} {
		c, err := ConfigFromEnv(envOf(map[string]string{EnvKeepWarm: value}))
		require.NoError(t, err, value)
		require.Equal(t, want, c.KeepWarm, value)
	}
	for _, value := range []string{"999", "3600001", "-1", "20s"} {
		_, err := ConfigFromEnv(envOf(map[string]string{EnvKeepWarm: value}))
		require.ErrorContains(t, err, EnvKeepWarm, value)
	}
}

func TestConfigIdlePoll(t *testing.T) {
	t.Parallel()
	for value, want := range map[string]time.Duration{
		"100": 100 * time.Millisecond, "3600000": time.Hour, " 600000 ": 10 * time.Minute,
	} {
		c, err := ConfigFromEnv(envOf(map[string]string{EnvIdlePoll: value}))
		require.NoError(t, err, value)
		require.Equal(t, want, c.IdlePoll, value)
	}
	for _, value := range []string{"99", "3600001", "0", "-5", "2s", "abc"} {
		_, err := ConfigFromEnv(envOf(map[string]string{EnvIdlePoll: value}))
		require.ErrorContains(t, err, EnvIdlePoll, value)
		require.ErrorContains(t, err, "100..3600000", value)
	}
	floor, ceiling := pollBackoff(DefaultIdlePoll)
	require.Equal(t, 250*time.Millisecond, floor, "the default idle poll starts at 250 ms")
	require.Equal(t, 2*time.Second, ceiling)
}

func TestConfigAPIOrigin(t *testing.T) {
	t.Parallel()
	for value, want := range map[string]string{
		"https://relay.example":       "https://relay.example",
		"https://relay.example/":      "https://relay.example",
		" http://127.0.0.1:3000/ ":    "http://127.0.0.1:3000",
		"https://relay.example:8443":  "https://relay.example:8443",
		"":                            "",
		"   ":                         "",
		"HTTPS://Relay.Example":       "HTTPS://Relay.Example",
		"https://[::1]:3000":          "https://[::1]:3000",
		"https://relay.example:443/ ": "https://relay.example:443",
	} {
		c, err := ConfigFromEnv(envOf(map[string]string{EnvAPIOrigin: value}))
		require.NoError(t, err, value)
		require.Equal(t, want, c.APIOrigin, value)
	}
	for value, why := range map[string]string{
		"relay.example":                 "scheme must be http or https",
		"ftp://relay.example":           "scheme must be http or https",
		"https://":                      "must have a host",
		"https://user:pw@relay.example": "must not contain credentials",
		"https://relay.example/api":     "must not have a path",
		"https://relay.example//":       "must not have a path",
		"https://relay.example?x=1":     "must not have a query",
		"https://relay.example#x":       "must not have a fragment",
		"https://relay.example/%zz":     "does not parse",
	} {
		_, err := ConfigFromEnv(envOf(map[string]string{EnvAPIOrigin: value}))
		require.ErrorContains(t, err, EnvAPIOrigin, value)
		require.ErrorContains(t, err, why, value)
	}
}
