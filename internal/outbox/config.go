package outbox

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Environment variables read by ConfigFromEnv.
const (
	EnvListeners = "BUZZ_OPERATOR_LISTENERS"
	EnvTimeout   = "BUZZ_OPERATOR_LISTENER_TIMEOUT_MS"
	EnvAPIOrigin = "RELAY_OPERATOR_API_ORIGIN"
	EnvIdlePoll  = "BUZZ_OPERATOR_LISTENER_POLL_MS"
	EnvKeepWarm  = "BUZZ_OPERATOR_LISTENER_KEEPALIVE_MS"
)

// DefaultTimeout bounds one delivery request when EnvTimeout is unset.
const DefaultTimeout = 5 * time.Second

// DefaultIdlePoll is the longest wait between two polls of an idle outbox
// when EnvIdlePoll is unset.
const DefaultIdlePoll = 2 * time.Second

// DefaultKeepWarm is how long a listener's connection may sit unused
// before the deliverer sends it a HEAD when EnvKeepWarm is unset: shorter
// than the idle timeouts common servers and proxies apply (60 s and up),
// so a mention after a quiet spell does not pay a new TLS handshake.
const DefaultKeepWarm = 20 * time.Second

// Routes maps a listener's lowercase 64-hex pubkey to its delivery URL,
// exactly as configured (the URL is also the NIP-98 u tag).
type Routes map[string]string

// pubkeys returns the routed listener keys as bytes, sorted: the claims'
// route filter.
func (r Routes) pubkeys() [][]byte {
	keys := make([]string, 0, len(r))
	for k := range r {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i], _ = hex.DecodeString(k) // validated by ConfigFromEnv
	}
	return out
}

// Config is the operator-listener configuration.
type Config struct {
	// Listeners is empty when delivery is disabled on this pod.
	Listeners Routes
	// Timeout is the hard limit of one delivery request.
	Timeout time.Duration
	// APIOrigin is the base of the URLs that /operator/* NIP-98 u tags must
	// name, without a trailing slash; empty when not configured.
	APIOrigin string
	// IdlePoll is the longest wait between two polls of an idle outbox: the
	// poll backs off from an eighth of it up to it. It bounds how late a row
	// the hand-off missed (saved by another pod, or dropped) is delivered,
	// and costs one claim query per pod per IdlePoll while nothing is due.
	IdlePoll time.Duration
	// KeepWarm: a listener whose connection carried nothing for this long
	// gets an unsigned HEAD of its URL, so its connection stays open (0:
	// never). The first is sent at start-up, so even the first mention
	// finds a connection ready.
	KeepWarm time.Duration
}

// ConfigFromEnv reads the configuration through getenv (os.Getenv in main).
// Any malformed value is an error, and start-up must fail on it (a
// listener silently dropped would never get its mentions); a bad listener entry is named by its position and pubkey.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := Config{Timeout: DefaultTimeout, IdlePoll: DefaultIdlePoll, KeepWarm: DefaultKeepWarm}
	var err error
	if c.Listeners, err = parseListeners(getenv(EnvListeners)); err != nil {
		return Config{}, err
	}
	if v := strings.TrimSpace(getenv(EnvTimeout)); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil || ms < 100 || ms > 10000 {
			return Config{}, fmt.Errorf("%s=%q: must be an integer number of milliseconds in 100..10000", EnvTimeout, v)
		}
		c.Timeout = time.Duration(ms) * time.Millisecond
	}
	if v := strings.TrimSpace(getenv(EnvIdlePoll)); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil || ms < 100 || ms > 3_600_000 {
			return Config{}, fmt.Errorf("%s=%q: must be an integer number of milliseconds in 100..3600000", EnvIdlePoll, v)
		}
		c.IdlePoll = time.Duration(ms) * time.Millisecond
	}
	if v := strings.TrimSpace(getenv(EnvKeepWarm)); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil || (ms != 0 && (ms < 1000 || ms > 3_600_000)) {
			return Config{}, fmt.Errorf("%s=%q: must be 0 (off) or an integer number of milliseconds in 1000..3600000", EnvKeepWarm, v)
		}
		c.KeepWarm = time.Duration(ms) * time.Millisecond
	}
	if c.APIOrigin, err = parseOrigin(getenv(EnvAPIOrigin)); err != nil {
		return Config{}, err
	}
	return c, nil
}

// parseListeners parses `<pubkey-hex>:<https-url>` entries separated by ';'.
func parseListeners(v string) (Routes, error) {
	routes := Routes{}
	for i, entry := range strings.Split(v, ";") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		// The first ':' ends the pubkey; the URL keeps its own colons.
		pub, rawURL, ok := strings.Cut(entry, ":")
		pub, rawURL = strings.ToLower(strings.TrimSpace(pub)), strings.TrimSpace(rawURL)
		fail := func(format string, args ...any) error {
			// Names the entry by position and pubkey, never by its URL text,
			// which may carry credentials.
			return fmt.Errorf("%s entry %d (%q): %s", EnvListeners, i+1, pub, fmt.Sprintf(format, args...))
		}
		if !ok {
			return nil, fail("want <64-hex pubkey>:<https URL>")
		}
		if b, err := hex.DecodeString(pub); err != nil || len(b) != 32 {
			return nil, fail("pubkey must be 64 hex characters")
		}
		if _, dup := routes[pub]; dup {
			return nil, fail("duplicate pubkey")
		}
		if err := checkListenerURL(rawURL); err != nil {
			return nil, fail("%v", err)
		}
		routes[pub] = rawURL
	}
	return routes, nil
}

func checkListenerURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return errors.New("URL does not parse")
	case u.Scheme != "https":
		return errors.New("URL scheme must be https")
	case u.Host == "" || u.Hostname() == "":
		return errors.New("URL must have a host")
	case u.User != nil:
		return errors.New("URL must not contain credentials")
	case u.RawQuery != "" || u.ForceQuery:
		return errors.New("URL must not have a query")
	case strings.Contains(raw, "#"):
		return errors.New("URL must not have a fragment")
	}
	return nil
}

// parseOrigin checks an http(s) origin and strips one trailing slash.
func parseOrigin(v string) (string, error) {
	v = strings.TrimSuffix(strings.TrimSpace(v), "/")
	if v == "" {
		return "", nil
	}
	fail := func(why string) (string, error) {
		return "", fmt.Errorf("%s: %s (want an origin such as https://relay.example)", EnvAPIOrigin, why)
	}
	u, err := url.Parse(v)
	switch {
	case err != nil:
		return fail("does not parse")
	case u.Scheme != "http" && u.Scheme != "https":
		return fail("scheme must be http or https")
	case u.Host == "" || u.Hostname() == "":
		return fail("must have a host")
	case u.User != nil:
		return fail("must not contain credentials")
	case u.Path != "" || u.RawPath != "":
		return fail("must not have a path")
	case u.RawQuery != "" || u.ForceQuery:
		return fail("must not have a query")
	case strings.Contains(v, "#"):
		return fail("must not have a fragment")
	}
	return v, nil
}
