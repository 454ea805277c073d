package relay_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// Every error answer of the webhook and the HTTP bridge (run history and
// recorded owners included, and the unknown host in front of them) says in
// its JSON error, behind a NIP-01 prefix, whether the caller should fix the
// request (invalid:, auth-required:) or send it again (rate-limited:,
// error:), as the WebSocket answers and the media routes do. Mutation
// killed: any one of the answers below without its prefix (they were bare:
// "authentication failed", "invalid workflow UUID", "body exceeds ...",
// "workflow not found", a NIP-98 reason, the capacity refusal with no error
// at all ...).
func TestEveryWebhookAndBridgeErrorAnswerIsPrefixed(t *testing.T) {
	t.Parallel()
	// No worker runs: the first call's run stays queued, so the second
	// meets the bound of one unfinished run.
	r := relaytest.Start(t, func(c *config.Config) {
		c.WebhookMaxBytes = 1024
		c.MaxMessageBytes = 2048
		c.WorkflowMaxUnfinishedRuns = 1
	})
	owner := r.Dial(t, "")
	owner.Auth(nil)
	ch := createChannel(t, owner, "prefixes", false)
	wf, secret := saveWebhookWorkflow(t, owner, ch, "[{id: tell, action: send_message, text: 'hi'}]")

	type answer struct {
		status int
		error  string
		raw    string
	}
	do := func(req *http.Request) answer {
		resp, err := bridgeHTTP.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		var out struct {
			Error string `json:"error"`
		}
		require.NoError(t, json.Unmarshal(raw, &out), "%s", raw)
		return answer{resp.StatusCode, out.Error, string(raw)}
	}
	hook := func(path string, headers map[string]string, body string) answer {
		req, err := http.NewRequest(http.MethodPost, r.HTTPURL+path, strings.NewReader(body))
		require.NoError(t, err)
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		return do(req)
	}
	withSecret := map[string]string{"X-Webhook-Secret": secret}
	with := func(k, v string) map[string]string {
		return map[string]string{"X-Webhook-Secret": secret, k: v}
	}
	get := func(key *nostr.SecretKey, path string) answer {
		req, err := http.NewRequest(http.MethodGet, r.HTTPURL+path, nil)
		require.NoError(t, err)
		if key != nil {
			req.Header.Set("Authorization", authHeader(nip98(t, key, "GET", r.HTTPURL+path, nil, nil)))
		}
		return do(req)
	}
	bridge := func(path string, body []byte, mutate func(*http.Request)) answer {
		req, err := http.NewRequest(http.MethodPost, r.HTTPURL+path, strings.NewReader(string(body)))
		require.NoError(t, err)
		req.Header.Set("Authorization", authHeader(nip98(t, owner.Key, "POST", r.HTTPURL+path, body, nil)))
		if mutate != nil {
			mutate(req)
		}
		return do(req)
	}
	unknownHost := func(req *http.Request) { req.Host = "nobody.example" }
	events := []byte(`{"kind":1`)
	big := []byte(`{"content":"` + strings.Repeat("x", 4096) + `"}`)
	badAttestation := func(req *http.Request) { req.Header.Set("X-Auth-Tag", "not json") }

	cases := []struct {
		name   string
		got    answer
		status int
	}{
		{"webhook: bad UUID", hook("/hooks/nope", withSecret, ""), 400},
		{"webhook: no secret", hook("/hooks/"+wf, nil, ""), 401},
		{"webhook: unknown workflow", hook("/hooks/"+uuid.NewString(), withSecret, ""), 401},
		{"webhook: not an object", hook("/hooks/"+wf, withSecret, "[1]"), 400},
		{"webhook: oversize", hook("/hooks/"+wf, withSecret, `{"a":"`+strings.Repeat("x", 1100)+`"}`), 413},
		{"webhook: bad depth", hook("/hooks/"+wf, with("X-Buzz-Workflow-Depth", "x"), ""), 400},
		{"webhook: too deep", hook("/hooks/"+wf, with("X-Buzz-Workflow-Depth", "5"), ""), 508},
		{"webhook: long key", hook("/hooks/"+wf, with("Idempotency-Key", strings.Repeat("k", 256)), ""), 400},
		{"webhook: key not UTF-8", hook("/hooks/"+wf, with("Idempotency-Key", "k\xff"), ""), 400},
		{"bridge: no auth", bridge("/count", nil, func(req *http.Request) { req.Header.Del("Authorization") }), 401},
		{"bridge: unknown host", bridge("/count", nil, unknownHost), 404},
		{"bridge: bad event", bridge("/events", events, nil), 400},
		{"bridge: oversize", bridge("/events", big, nil), 413},
		{"bridge: bad attestation", bridge("/count", []byte(`{"filters":[{}]}`), badAttestation), 400},
		{"history: bad id", get(owner.Key, "/workflows/nope/runs"), 400},
		{"history: bad limit", get(owner.Key, "/workflows/"+wf+"/runs?limit=0"), 400},
		{"history: unknown workflow", get(owner.Key, "/workflows/"+uuid.NewString()+"/runs"), 404},
		{"history: bad run id", get(owner.Key, "/workflows/"+wf+"/runs/nope/approvals"), 400},
		{"history: unknown run", get(owner.Key, "/workflows/"+wf+"/runs/"+uuid.NewString()+"/approvals"), 404},
		{"recorded owner: bad pubkey", get(owner.Key, "/v1/users/nope/recorded-owner"), 400},
		{"recorded owner: none", get(owner.Key, "/v1/users/"+strings.Repeat("ab", 32)+"/recorded-owner"), 404},
		{"root: unknown path", get(nil, "/nope"), 404},
	}
	first := hook("/hooks/"+wf, withSecret, `{}`)
	require.Equal(t, http.StatusAccepted, first.status, first.raw)
	cases = append(cases, struct {
		name   string
		got    answer
		status int
	}{"webhook: at capacity", hook("/hooks/"+wf, withSecret, `{}`), 429})
	// Every case is checked, so a failure lists each bare answer.
	for _, c := range cases {
		assert.Equal(t, c.status, c.got.status, "%s: %s", c.name, c.got.raw)
		assert.Regexp(t, nip01Prefix, c.got.error, "%s: %s", c.name, c.got.raw)
	}
}
