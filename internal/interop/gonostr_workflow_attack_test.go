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
	require.Equal(t, "step hook: url: a value may not leave a path segment empty or make it \".\" or \"..\"", message)
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

// Outsiders of a private channel, a member removed from it and a member
// who is not the workflow's owner try every workflow write and read on it
// through go-nostr: save a definition there or under its workflow's id,
// run it, decide its approvals (named approver and "any"), forge the
// relay's notices, archive it by coordinate, and read its definitions,
// commands, approvals and messages with every filter shape and COUNT.
// Each write gets the answer an unknown workflow, approval or channel
// gets, or the refusal of its rule; nothing of the channel comes back; the
// workflow stays active and no approval is decided. A sweep of what held in
// an outside review; each rule's own test names its mutation. Mutation
// killed here: prepareDecision without its channel check
// (bindWriteOrHide) lets an outsider grant an "any" approval.
func TestGoNostrOutsidersCannotTouchAPrivateChannelsWorkflows(t *testing.T) {
	t.Parallel()
	r, _, _ := startRelayWithHookServer(t)
	alice, bob, mallory, carol := connectGo(t, r), connectGo(t, r), connectGo(t, r), connectGo(t, r)
	p := uuid.NewString()
	alice.publish(9007, "", nostr.Tags{{"h", p}, {"name", "secret"}, {"visibility", "private"}}, nostr.Now())
	alice.publish(9000, "", nostr.Tags{{"h", p}, {"p", bob.pk}}, nostr.Now())
	alice.publish(9000, "", nostr.Tags{{"h", p}, {"p", carol.pk}}, nostr.Now())
	o := uuid.NewString()
	mallory.publish(9007, "", nostr.Tags{{"h", o}, {"name", "mine"}}, nostr.Now())

	gate := uuid.NewString()
	alice.publish(30620, "name: Gate\ntrigger: {on: message_posted}\nsteps:\n"+
		"  - {id: ask, action: request_approval, from: "+alice.pk+", message: 'Approve zebra?'}\n"+
		"  - {id: say, action: send_message, text: 'approved zebra'}\n", nostr.Tags{{"d", gate}, {"h", p}}, nostr.Now())
	anyone := uuid.NewString()
	alice.publish(30620, "name: Any\ntrigger: {on: reaction_added}\nsteps: [{id: ask, action: request_approval, from: any, message: 'Anyone zebra?'}]",
		nostr.Tags{{"d", anyone}, {"h", p}}, nostr.Now())
	carols := uuid.NewString()
	carol.publish(30620, "name: C\ntrigger: {on: message_posted, filter: 'false'}\nsteps: [{id: s, action: send_message, text: 'carol zebra'}]",
		nostr.Tags{{"d", carols}, {"h", p}}, nostr.Now())
	msg := bob.publish(9, "zebra please", nostr.Tags{{"h", p}}, nostr.Now())
	bob.publish(7, "+", nostr.Tags{{"h", p}, {"e", msg.ID}}, nostr.Now())
	var requests []*nostr.Event
	require.Eventually(t, func() bool {
		requests = alice.query(nostr.Filter{Kinds: []int{46010}, Tags: nostr.TagMap{"h": {p}}})
		return len(requests) == 2
	}, wait, 20*time.Millisecond)
	refs := map[string]string{}
	for _, ev := range requests {
		refs[ev.Content] = ev.Tags.GetFirst([]string{"approval", ""}).Value()
	}
	gateRef, anyRef := refs["Approve zebra?"], refs["Anyone zebra?"]
	require.NotEmpty(t, gateRef)
	require.NotEmpty(t, anyRef)
	alice.publish(9001, "", nostr.Tags{{"h", p}, {"p", carol.pk}}, nostr.Now())

	step := "name: x\ntrigger: {on: message_posted}\nsteps: [{id: s, action: send_message, text: hi}]"
	for _, try := range []struct {
		who  *goClient
		kind int
		body string
		tags nostr.Tags
		want string
	}{
		{mallory, 30620, step, nostr.Tags{{"d", uuid.NewString()}, {"h", p}}, "restricted: not a member of this channel"},
		{mallory, 30620, step, nostr.Tags{{"d", gate}, {"h", o}}, "restricted: workflow belongs to a different owner or channel"},
		{bob, 30620, step, nostr.Tags{{"d", gate}, {"h", p}}, "restricted: workflow belongs to a different owner or channel"},
		{bob, 30620, "name: x\ntrigger: {on: message_posted}\nsteps: [{id: s, action: call_webhook, url: 'https://example.com/x'}]",
			nostr.Tags{{"d", uuid.NewString()}, {"h", p}}, "restricted: call_webhook needs the owner or admin role in the channel"},
		{carol, 30620, step, nostr.Tags{{"d", carols}, {"h", p}}, "restricted: not a member of this channel"},
		{mallory, 46020, "", nostr.Tags{{"d", gate}}, "invalid: workflow not found"},
		{mallory, 46020, "", nostr.Tags{{"d", gate}, {"h", o}}, "invalid: workflow not found"},
		{bob, 46020, "", nostr.Tags{{"d", gate}}, "restricted: not authorized to trigger this workflow"},
		{carol, 46020, "", nostr.Tags{{"d", carols}}, "invalid: workflow not found"},
		{mallory, 46030, "", nostr.Tags{{"d", gateRef}}, "invalid: approval not found"},
		{mallory, 46030, "", nostr.Tags{{"d", anyRef}}, "invalid: approval not found"},
		{mallory, 46031, "", nostr.Tags{{"d", anyRef}, {"h", o}}, "invalid: approval not found"},
		{carol, 46030, "", nostr.Tags{{"d", anyRef}}, "invalid: approval not found"},
		{bob, 46030, "", nostr.Tags{{"d", gateRef}}, "restricted: not the approver of this step"},
		{bob, 46031, "", nostr.Tags{{"e", gateRef}}, "restricted: not the approver of this step"},
		{mallory, 46011, "", nostr.Tags{{"h", o}, {"approval", gateRef}}, "restricted: only the relay publishes kind 46011"},
		{mallory, 46010, "", nostr.Tags{{"h", o}, {"approval", gateRef}, {"p", alice.pk}}, "restricted: only the relay publishes kind 46010"},
	} {
		err := try.who.send(try.who.sign(try.kind, try.body, try.tags, nostr.Now()))
		require.ErrorContains(t, err, "msg: "+try.want, "kind %d %v", try.kind, try.tags)
	}
	// A deletion by coordinate names its signer's workflows only: accepted,
	// it archives nothing of Alice's.
	mallory.publish(5, "", nostr.Tags{{"a", "30620:" + alice.pk + ":" + gate}}, nostr.Now())
	bob.publish(5, "", nostr.Tags{{"a", "30620:" + alice.pk + ":" + anyone}, {"h", p}}, nostr.Now())

	for _, reader := range []*goClient{mallory, carol} {
		for _, f := range []nostr.Filter{
			{Kinds: []int{30620, 46010, 46011, 46012, 46020, 46030, 46031, 9, 7}},
			{Tags: nostr.TagMap{"d": {gate, anyone, carols, gateRef, anyRef}}},
			{IDs: []string{msg.ID, requests[0].ID, requests[1].ID}},
			{Tags: nostr.TagMap{"e": {msg.ID}}},
			{Tags: nostr.TagMap{"p": {alice.pk, bob.pk}}},
			{Authors: []string{alice.pk, bob.pk, carol.pk}},
			{Search: "zebra"},
			{Kinds: []int{46010}, Search: "Approve"},
		} {
			for _, ev := range reader.query(f) {
				require.Nil(t, ev.Tags.GetFirst([]string{"h", p}), "%v sent an event of the channel", f)
				require.NotContains(t, ev.Content, "zebra", "%v", f)
			}
			if reader == mallory {
				if f.Search != "" || len(f.IDs) > 0 || len(f.Authors) > 0 {
					require.Zero(t, reader.count(f), "COUNT %v", f)
				}
			}
		}
		require.Contains(t, reader.reqClosedReasonFor(nostr.Filter{Kinds: []int{46010}, Tags: nostr.TagMap{"h": {p}}}), "restricted: not a channel member")
	}

	var active, decided int
	require.NoError(t, r.Pool.QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM workflows WHERE community_id = $1 AND status = 'active' AND enabled AND owner_pubkey = decode($2, 'hex')),
		        (SELECT count(*) FROM workflow_approvals WHERE community_id = $1 AND status <> 'pending')`,
		r.CommunityID, alice.pk).Scan(&active, &decided))
	require.Equal(t, 2, active, "Alice's workflows are as she left them")
	require.Zero(t, decided, "no approval was decided")
}
