package interop

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nbd-wtf/go-nostr"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// hookCall is what a webhook server was sent.
type hookCall struct {
	path, query, auth string
}

// startRelayWithHookServer runs a relay whose workflows may call a TLS
// server on loopback, and that server, which records every call.
func startRelayWithHookServer(t *testing.T) (*relaytest.Relay, *httptest.Server, func() []hookCall) {
	t.Helper()
	var mu sync.Mutex
	var calls []hookCall
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls = append(calls, hookCall{path: r.URL.EscapedPath(), query: r.URL.RawQuery, auth: r.Header.Get("Authorization")})
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	r := relaytest.Start(t, func(c *config.Config) {
		c.WorkflowWebhookAllowedNets = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	roots := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	require.NoError(t, r.Server.StartWorkflows(ctx, relay.WithWebhookRootCAs(roots)))
	return r, srv, func() []hookCall {
		mu.Lock()
		defer mu.Unlock()
		return append([]hookCall(nil), calls...)
	}
}

// A channel's owner saves a workflow that calls their issue tracker with
// their token, the message's text in the URL's path. Any member of the
// open channel writes that text: "1/close?force=" made the relay call
// /issues/1/close?force= with the owner's token, another endpoint than the
// owner named, and ".." climbed out of the path. Now a placeholder's value
// is one piece of data in the URL, percent-encoded, and a dot segment
// fails the run (template_resolution_failed) without a call.
//
// Mutation killed: rendering the URL with template.Render (values as
// written) sends /issues/1/close?force=/comments and calls
// /issues/../comments.
func TestGoNostrMemberTextStaysDataInAWebhookURL(t *testing.T) {
	t.Parallel()
	r, srv, calls := startRelayWithHookServer(t)
	owner, member := connectGo(t, r), connectGo(t, r)
	ch := uuid.NewString()
	owner.publish(9007, "", nostr.Tags{{"h", ch}, {"name", "tracker"}, {"visibility", "open"}}, nostr.Now())
	wf := uuid.NewString()
	owner.publish(30620, "name: Comment\ntrigger: {on: message_posted}\nsteps:\n"+
		"  - {id: hook, action: call_webhook, url: '"+srv.URL+"/issues/{{trigger.text}}/comments', headers: {Authorization: 'Bearer owner-token'}}\n",
		nostr.Tags{{"d", wf}, {"h", ch}}, nostr.Now())

	member.publish(9, "1/close?force=", nostr.Tags{{"h", ch}}, nostr.Now())
	require.Eventually(t, func() bool { return len(calls()) == 1 }, wait, 20*time.Millisecond)
	require.Equal(t, hookCall{path: "/issues/1%2Fclose%3Fforce%3D/comments", auth: "Bearer owner-token"}, calls()[0])

	dots := member.publish(9, "..", nostr.Tags{{"h", ch}}, nostr.Now())
	var code, message string
	require.Eventually(t, func() bool {
		err := r.Pool.QueryRow(context.Background(),
			`SELECT coalesce(error_code, ''), coalesce(error_message, '') FROM workflow_runs
			 WHERE community_id = $1 AND trigger_context->>'message_id' = $2 AND completed_at IS NOT NULL`,
			r.CommunityID, dots.ID).Scan(&code, &message)
		return err == nil
	}, wait, 20*time.Millisecond)
	require.Equal(t, "template_resolution_failed", code, message)
	require.Equal(t, "step hook: url: a value may not be the path segment \".\" or \"..\"", message)
	require.Len(t, calls(), 1, "no call for the dot segment")
}

// Where the call goes is the owner's signed choice: a placeholder in the
// scheme, host or port of a call_webhook URL is refused when saved, since
// whoever writes the value (any member, for a message trigger) would pick
// the server that gets the owner's headers: "https://127.0.0.1{{x}}/hook"
// with the text ":<port>" went to another server, ".evil.example" to
// another domain. Mutation killed: without the save check the definition
// is accepted.
func TestGoNostrWebhookURLHostIsNotAPlaceholder(t *testing.T) {
	t.Parallel()
	r, srv, _ := startRelayWithHookServer(t)
	owner := connectGo(t, r)
	ch := uuid.NewString()
	owner.publish(9007, "", nostr.Tags{{"h", ch}, {"name", "hooks"}}, nostr.Now())
	for _, url := range []string{"https://127.0.0.1{{trigger.text}}/hook", "https://{{trigger.text}}/hook", "{{trigger.text}}", "https://127.0.0.1:{{trigger.text}}"} {
		err := owner.send(owner.sign(30620, "name: Steer\ntrigger: {on: message_posted}\nsteps:\n"+
			"  - {id: hook, action: call_webhook, url: '"+url+"', headers: {Authorization: 'Bearer owner-token'}}\n",
			nostr.Tags{{"d", uuid.NewString()}, {"h", ch}}, nostr.Now()))
		require.ErrorContains(t, err, "invalid: workflow YAML parse error: invalid definition: steps[0].url: a placeholder may not stand in the scheme, host or port", url)
	}
	owner.publish(30620, "name: Fine\ntrigger: {on: message_posted}\nsteps:\n"+
		"  - {id: hook, action: call_webhook, url: '"+srv.URL+"?q={{trigger.text}}'}\n",
		nostr.Tags{{"d", uuid.NewString()}, {"h", ch}}, nostr.Now())
}
