package doorbell_test

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/doorbell"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// relayQuerier reads from a real relay over an agent's authenticated
// connection (one REQ per query, up to EOSE). Tests that need an artifact
// the relay would refuse to store (a forged signature, a command from
// someone else) add it to extra: it is returned for queries naming its id,
// as a lying relay would.
//
// With a stand-in relay key (standIn), the querier shows the world as if
// that key were the relay's: relay-signed events (the member list) come
// back signed by the stand-in, and a filter naming it as author asks for
// the real relay key.
type relayQuerier struct {
	mu       sync.Mutex
	c        *relaytest.Client
	extra    []*nostr.Event
	calls    int
	realKey  string
	standIn  *nostr.SecretKey
	resigned func(*nostr.Event) *nostr.Event
}

func (q *relayQuerier) Query(_ context.Context, filter map[string]any) ([]*nostr.Event, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.calls++
	if q.standIn != nil {
		if authors, ok := filter["authors"].([]string); ok {
			mapped := slices.Clone(authors)
			for i, a := range mapped {
				if a == q.standIn.PublicKeyHex() {
					mapped[i] = q.realKey
				}
			}
			filter = maps.Clone(filter)
			filter["authors"] = mapped
		}
	}
	events := q.c.Req("verify", filter)
	if q.standIn != nil {
		for i, e := range events {
			if e.PubKey == q.realKey {
				events[i] = q.resigned(e)
			}
		}
	}
	if ids, ok := filter["ids"].([]string); ok {
		for _, e := range q.extra {
			if slices.Contains(ids, e.ID) {
				events = append([]*nostr.Event{e}, events...)
			}
		}
	}
	return events, nil
}

func (q *relayQuerier) inject(ev *nostr.Event) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.extra = append(q.extra, ev)
}

// testClock is a clock the test moves by hand.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// fixture is a real relay running workflows, a channel with its owner
// (display name "Olive"), an agent member "Robby" and a member "Sam", and a
// stand-in relay key for doorbells a test tampers with and signs again.
type fixture struct {
	t         *testing.T
	r         *relaytest.Relay
	owner     *relaytest.Client
	agent     *relaytest.Client
	sam       *relaytest.Client
	ch        string
	relayKey  string
	fakeRelay *nostr.SecretKey
	clock     *testClock
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	// Schedules of a slot every two seconds, to see them fire.
	r := relaytest.Start(t, func(c *config.Config) { c.WorkflowMinScheduleInterval = time.Second })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, r.Server.StartWorkflows(ctx))
	f := &fixture{t: t, r: r, fakeRelay: relaytest.NewKey(t), clock: &testClock{now: time.Unix(1_900_000_000, 0)}}
	f.owner = r.Dial(t, "")
	f.owner.Auth(nil)
	f.agent = r.Dial(t, "")
	f.agent.Auth(nil)
	f.sam = r.Dial(t, "")
	f.sam.Auth(nil)
	f.ch = uuid.NewString()
	require.True(t, f.owner.Publish(f.owner.Sign(9007, "", nostr.Tags{{"h", f.ch}, {"name", "ops"}}, 0)).OK)
	for c, name := range map[*relaytest.Client]string{f.owner: "Olive", f.agent: "Robby", f.sam: "Sam"} {
		ok := c.Publish(c.Sign(0, `{"name":"`+name+`"}`, nil, 0))
		require.True(t, ok.OK, ok.Msg)
		if c != f.owner {
			ok = f.owner.Publish(f.owner.Sign(9000, "", nostr.Tags{{"h", f.ch}, {"p", c.Key.PublicKeyHex()}}, 0))
			require.True(t, ok.OK, ok.Msg)
		}
	}
	f.relayKey = nip11Self(t, r)
	return f
}

func nip11Self(t *testing.T, r *relaytest.Relay) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, r.HTTPURL, nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "application/nostr+json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var doc struct {
		Self string `json:"self"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&doc))
	require.True(t, nostr.IsHex64(doc.Self), "NIP-11 self %q", doc.Self)
	return doc.Self
}

// saveWorkflow publishes a definition as the owner and returns its event
// and the webhook secret, if one was issued.
func (f *fixture) saveWorkflow(id, yaml string) (*nostr.Event, string) {
	f.t.Helper()
	ev := f.owner.Sign(30620, yaml, nostr.Tags{{"d", id}, {"h", f.ch}}, 0)
	ok := f.owner.Publish(ev)
	require.True(f.t, ok.OK, ok.Msg)
	var saved struct {
		WebhookSecret string `json:"webhook_secret"`
	}
	require.NoError(f.t, json.Unmarshal([]byte(strings.TrimPrefix(ok.Msg, "response:")), &saved))
	return ev, saved.WebhookSecret
}

// post publishes a kind 9 in the channel as c.
func (f *fixture) post(c *relaytest.Client, text string, extra ...nostr.Tag) *nostr.Event {
	f.t.Helper()
	ev := c.Sign(9, text, append(nostr.Tags{{"h", f.ch}}, extra...), 0)
	ok := c.Publish(ev)
	require.True(f.t, ok.OK, ok.Msg)
	return ev
}

// bell waits for the relay's doorbell whose cause value is ref (or, for
// ref "", the first doorbell of definition defID).
func (f *fixture) bell(defID, causeKind, ref string) *nostr.Event {
	f.t.Helper()
	var found *nostr.Event
	require.Eventually(f.t, func() bool {
		for _, ev := range f.owner.Req("bells", map[string]any{"kinds": []int{9}, "#h": []string{f.ch}, "authors": []string{f.relayKey}}) {
			def, cause := ev.Tags.First("workflow-definition"), ev.Tags.First("workflow-cause")
			if def != nil && cause != nil && len(cause) == 3 && def[1] == defID && cause[1] == causeKind && (ref == "" || cause[2] == ref) {
				found = ev
				return true
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond, "doorbell of %s %s %s", defID, causeKind, ref)
	return found
}

// verifier returns a verifier for agent, reading the relay over agent's
// connection. fake makes it trust the stand-in relay key instead of the
// real one, for doorbells the test has signed again.
func (f *fixture) verifier(agent *relaytest.Client, fake bool) (*doorbell.Verifier, *relayQuerier) {
	q := &relayQuerier{c: agent}
	relayKey := f.relayKey
	if fake {
		relayKey = f.fakeRelay.PublicKeyHex()
		q.realKey, q.standIn = f.relayKey, f.fakeRelay
		q.resigned = func(ev *nostr.Event) *nostr.Event { return f.resign(ev, nil) }
	}
	return doorbell.NewVerifier(doorbell.Options{
		RelayPubkey: relayKey, AgentPubkey: agent.Key.PublicKeyHex(), Query: q, Now: f.clock.Now,
	}), q
}

// resign copies a doorbell, lets mutate change it, and signs it with the
// stand-in relay key.
func (f *fixture) resign(ev *nostr.Event, mutate func(*nostr.Event)) *nostr.Event {
	f.t.Helper()
	cp := &nostr.Event{Kind: ev.Kind, Content: ev.Content, CreatedAt: ev.CreatedAt}
	for _, tag := range ev.Tags {
		cp.Tags = append(cp.Tags, slices.Clone(tag))
	}
	if mutate != nil {
		mutate(cp)
	}
	require.NoError(f.t, cp.Sign(f.fakeRelay))
	return cp
}

// setTag replaces the first tag named name (or appends it).
func setTag(ev *nostr.Event, tag ...string) {
	for i, t := range ev.Tags {
		if len(t) > 0 && t[0] == tag[0] {
			ev.Tags[i] = tag
			return
		}
	}
	ev.Tags = append(ev.Tags, tag)
}

func removeTag(ev *nostr.Event, name string) {
	ev.Tags = slices.DeleteFunc(ev.Tags, func(t nostr.Tag) bool { return len(t) > 0 && t[0] == name })
}

func requireDrop(t *testing.T, err error, reason string) {
	t.Helper()
	var d *doorbell.Drop
	require.ErrorAs(t, err, &d)
	require.Equal(t, reason, d.Reason, "%s", d.Detail)
	require.Contains(t, doorbell.AllReasons, d.Reason)
}

// signed builds an event signed by key (a stand-in for an artifact the
// relay would not store, or one the test wants to exist only in extra).
func signed(t *testing.T, key *nostr.SecretKey, kind int, content string, tags nostr.Tags) *nostr.Event {
	t.Helper()
	return relaytest.SignEvent(t, key, kind, content, tags, 0)
}
