package doorbell_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/doorbell"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// memQuerier answers filters from a fixed set of events with NIP-01
// matching (the relay's own filter code), for the benchmark and the fuzz
// test, which must not measure or depend on a network round trip.
type memQuerier struct{ events []*nostr.Event }

func (m *memQuerier) Query(_ context.Context, filter map[string]any) ([]*nostr.Event, error) {
	raw, err := json.Marshal(filter)
	if err != nil {
		return nil, err
	}
	var f nostr.Filter
	if err := f.UnmarshalJSON(raw); err != nil {
		return nil, err
	}
	var out []*nostr.Event
	for _, e := range m.events {
		if f.Matches(e) {
			out = append(out, e)
		}
	}
	return out, nil
}

// memWorld is a signed world without a relay: a definition whose template
// names the agent, the message that fired it, the channel's member list
// with members profiles, and the relay's doorbell.
type memWorld struct {
	relay, owner, agent *nostr.SecretKey
	q                   *memQuerier
	bell                *nostr.Event
	hook                *nostr.Event
}

func newMemWorld(tb testing.TB, members int) *memWorld {
	tb.Helper()
	w := &memWorld{relay: relaytest.NewKey(tb), owner: relaytest.NewKey(tb), agent: relaytest.NewKey(tb), q: &memQuerier{}}
	ch, wf, hookWF := uuid.NewString(), uuid.NewString(), uuid.NewString()
	add := func(key *nostr.SecretKey, kind int, content string, tags nostr.Tags) *nostr.Event {
		ev := relaytest.SignEvent(tb, key, kind, content, tags, 1_900_000_000)
		w.q.events = append(w.q.events, ev)
		return ev
	}
	def := add(w.owner, 30620, `name: Triage
trigger: {on: message_posted, filter: 'str_contains(trigger_text, "deploy")'}
steps: [{id: ask, action: send_message, text: "@Robby please look at {{trigger.text | truncate(200)}} from {{trigger.author | npub}}"}]
`, nostr.Tags{{"d", wf}, {"h", ch}})
	hookDef := add(w.owner, 30620, "name: Hook\ntrigger: {on: webhook}\nsteps: [{id: tell, action: send_message, text: \"deploy of {{trigger.env}}: {{trigger.note}}\"}]\n",
		nostr.Tags{{"d", hookWF}, {"h", ch}})
	// The message is a third member's: a verifier never wakes for its own.
	poster := relaytest.NewKey(tb)
	list := nostr.Tags{{"d", ch}, {"p", w.owner.PublicKeyHex()}, {"p", w.agent.PublicKeyHex()}, {"p", poster.PublicKeyHex()}}
	add(w.owner, 0, `{"name":"Olive"}`, nil)
	add(w.agent, 0, `{"display_name":"Robby"}`, nil)
	for i := range members {
		k := relaytest.NewKey(tb)
		list = append(list, nostr.Tag{"p", k.PublicKeyHex()})
		add(k, 0, `{"name":"Member `+strconv.Itoa(i)+`"}`, nil)
	}
	add(w.relay, 39002, "", list)
	msg := add(poster, 9, "deploy failed on prod", nostr.Tags{{"h", ch}})
	bell := func(def *nostr.Event, step string, cause nostr.Tag, extra ...nostr.Tag) *nostr.Event {
		tags := nostr.Tags{
			{"workflow-run", uuid.NewString()}, {"workflow-step", step}, {"workflow-owner", w.owner.PublicKeyHex()},
			{"workflow-definition", def.ID, step}, cause, {"p", w.owner.PublicKeyHex()}, {"h", ch},
			{"buzz:workflow", "doorbell-v1"}, {"p", w.agent.PublicKeyHex()},
		}
		return relaytest.SignEvent(tb, w.relay, 9, "relay prose, never read", append(tags, extra...), 1_900_000_001)
	}
	w.bell = bell(def, "ask", nostr.Tag{"workflow-cause", "event", msg.ID})
	w.hook = bell(hookDef, "tell", nostr.Tag{"workflow-cause", "webhook", ""}, nostr.Tag{"workflow-cargo", `{"env":"prod","note":"all green"}`})
	return w
}

// verifier for key, whose replay memory forgets at once and whose clock
// moves a minute per call, so one doorbell can be verified again and
// again at full cost.
func (w *memWorld) verifier(key *nostr.SecretKey) *doorbell.Verifier {
	now := time.Unix(1_900_000_000, 0)
	return doorbell.NewVerifier(doorbell.Options{
		RelayPubkey: w.relay.PublicKeyHex(), AgentPubkey: key.PublicKeyHex(), Query: w.q,
		Now:       func() time.Time { now = now.Add(time.Minute); return now },
		DedupeTTL: time.Nanosecond,
	})
}

func TestMemoryWorldVerifies(t *testing.T) {
	t.Parallel()
	w := newMemWorld(t, 20)
	ctx := context.Background()
	wake, err := w.verifier(w.agent).Verify(ctx, w.bell)
	require.NoError(t, err)
	require.Contains(t, wake.Prompt, "@Robby please look at [member text 1] from npub1")
	require.Contains(t, wake.Prompt, `[member text 1] text: "deploy failed on prod"`)
	_, err = w.verifier(w.owner).Verify(ctx, w.bell)
	require.NoError(t, err)
	_, err = w.verifier(w.agent).Verify(ctx, w.hook)
	requireDrop(t, err, "not_mentioned")
	_, err = w.verifier(w.owner).Verify(ctx, w.hook)
	require.NoError(t, err)
}

// Who a doorbell may wake is read from signed data only: a profile whose
// signature fails does not count (here it would make "Robby" ambiguous and
// wake nobody), a genuine second "Robby" among the members does, and a
// member list not signed by the relay is no list.
// Kills: not verifying profile signatures; not verifying the member list.
func TestMentionWakeReadsSignedMembersOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newMemWorld(t, 3)
	list := w.q.events[len(w.q.events)-2]
	require.Equal(t, 39002, list.Kind)
	impostor := relaytest.NewKey(t)
	forged := relaytest.SignEvent(t, impostor, 0, `{"name":"Robby"}`, nil, 0)
	forged.Content = `{"name":"robby"}` // signed as "Robby", served changed
	w.q.events = append(w.q.events, forged)
	resigned := relaytest.SignEvent(t, w.relay, 39002, "", append(list.Tags, nostr.Tag{"p", impostor.PublicKeyHex()}), list.CreatedAt+1)
	w.q.events = append(w.q.events, resigned)
	_, err := w.verifier(w.agent).Verify(ctx, w.bell)
	require.NoError(t, err, "a forged profile is ignored")

	w.q.events = append(w.q.events, relaytest.SignEvent(t, impostor, 0, `{"name":"ROBBY"}`, nil, forged.CreatedAt+1))
	_, err = w.verifier(w.agent).Verify(ctx, w.bell)
	requireDrop(t, err, "not_mentioned")

	w2 := newMemWorld(t, 0)
	for i, e := range w2.q.events {
		if e.Kind == 39002 {
			cp := *e
			cp.Tags = append(cp.Tags, nostr.Tag{"p", impostor.PublicKeyHex()})
			w2.q.events[i] = &cp // the relay's signature no longer covers it
		}
	}
	_, err = w2.verifier(w2.agent).Verify(ctx, w2.bell)
	requireDrop(t, err, "members_unverified")
}

// The replay memory is bounded by both its size and its TTL: the oldest
// cause is forgotten first when the memory is full, and every cause once
// its TTL passed (a replay after that gets through, by design).
// Kills: a memory without eviction, or without expiry.
func TestReplayMemoryIsBounded(t *testing.T) {
	t.Parallel()
	w := newMemWorld(t, 0)
	ctx := context.Background()
	now := time.Unix(1_900_000_000, 0)
	v := doorbell.NewVerifier(doorbell.Options{
		RelayPubkey: w.relay.PublicKeyHex(), AgentPubkey: w.owner.PublicKeyHex(), Query: w.q,
		Now: func() time.Time { return now }, DedupeEntries: 2, DedupeTTL: time.Hour,
	})
	schedDef := relaytest.SignEvent(t, w.owner, 30620, "name: T\ntrigger: {on: schedule, interval: 60s}\nsteps: [{id: t, action: send_message, text: tick}]\n",
		nostr.Tags{{"d", uuid.NewString()}, w.bell.Tags.First("h")}, 0)
	w.q.events = append(w.q.events, schedDef)
	slot := func(n int64) *nostr.Event {
		ev := &nostr.Event{Kind: 9, CreatedAt: 1, Tags: nostr.Tags{
			{"workflow-run", uuid.NewString()}, {"workflow-step", "t"}, {"workflow-owner", w.owner.PublicKeyHex()},
			{"workflow-definition", schedDef.ID, "t"}, {"workflow-cause", "schedule", strconv.FormatInt(n*60, 10)},
			{"p", w.owner.PublicKeyHex()}, w.bell.Tags.First("h"), {"buzz:workflow", "doorbell-v1"},
		}}
		require.NoError(t, ev.Sign(w.relay))
		return ev
	}
	verify := func(n int64) error { _, err := v.Verify(ctx, slot(n)); return err }
	require.NoError(t, verify(1))
	require.NoError(t, verify(2))
	requireDrop(t, verify(1), "duplicate")
	require.NoError(t, verify(3)) // evicts 1, the least recently recorded
	require.NoError(t, verify(1), "evicted, so it passes again")
	requireDrop(t, verify(3), "duplicate")
	now = now.Add(time.Hour)
	require.NoError(t, verify(3), "expired")
}

// A replay key a previous process recorded (Wake.ReplayKey, handed back in
// Options.Spent) is a duplicate for a new verifier, until its TTL passes; a
// webhook wake has no key.
// Kills: ignoring Options.Spent (a restart lets the replay through); loading
// expired keys.
func TestSpentKeysSurviveARestart(t *testing.T) {
	t.Parallel()
	w := newMemWorld(t, 0)
	ctx := context.Background()
	now := time.Unix(1_900_000_000, 0)
	opts := doorbell.Options{
		RelayPubkey: w.relay.PublicKeyHex(), AgentPubkey: w.owner.PublicKeyHex(), Query: w.q,
		Now: func() time.Time { return now }, DedupeTTL: time.Hour,
	}
	wake, err := doorbell.NewVerifier(opts).Verify(ctx, w.bell)
	require.NoError(t, err)
	require.NotEmpty(t, wake.ReplayKey)

	restarted := opts
	restarted.Spent = map[string]time.Time{wake.ReplayKey: now}
	_, err = doorbell.NewVerifier(restarted).Verify(ctx, w.bell)
	requireDrop(t, err, "duplicate")

	restarted.Spent = map[string]time.Time{wake.ReplayKey: now.Add(-time.Hour)}
	_, err = doorbell.NewVerifier(restarted).Verify(ctx, w.bell)
	require.NoError(t, err, "a key older than the TTL is not loaded")
}

// BenchmarkVerify measures verification cost per doorbell against an
// in-memory querier (no network): event causes woken as the owner and as
// a member named in the template (member list and profiles of 50 members
// read and checked), and a webhook doorbell with cargo.
func BenchmarkVerify(b *testing.B) {
	w := newMemWorld(b, 50)
	ctx := context.Background()
	for _, c := range []struct {
		name string
		key  *nostr.SecretKey
		bell *nostr.Event
	}{
		{"event/owner", w.owner, w.bell},
		{"event/mentioned-of-52", w.agent, w.bell},
		{"webhook/owner", w.owner, w.hook},
	} {
		b.Run(c.name, func(b *testing.B) {
			v := w.verifier(c.key)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.Verify(ctx, c.bell); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzVerifyEnvelope feeds arbitrary tag lists and cargo to the verifier
// (signed, so they reach every parser): it must never panic, and every
// refusal is a *Drop with a listed reason.
func FuzzVerifyEnvelope(f *testing.F) {
	w := newMemWorld(f, 2)
	seedTags, _ := json.Marshal(w.hook.Tags)
	f.Add(string(seedTags))
	seedTags, _ = json.Marshal(w.bell.Tags)
	f.Add(string(seedTags))
	f.Add(`[["workflow-cause","schedule","-1"],["workflow-cargo","{\"a\":\"{{trigger.a}}\"}"]]`)
	f.Add(`[["workflow-definition"],["h"],["p"]]`)
	f.Fuzz(func(t *testing.T, tagsJSON string) {
		var tags nostr.Tags
		if json.Unmarshal([]byte(tagsJSON), &tags) != nil {
			return
		}
		for _, tag := range tags {
			if len(tag) == 0 {
				return // the wire parser refuses empty tags
			}
		}
		ev := &nostr.Event{Kind: 9, CreatedAt: 1, Tags: tags}
		if ev.Sign(w.relay) != nil {
			return
		}
		wake, err := w.verifier(w.owner).Verify(context.Background(), ev)
		if err == nil {
			require.NotNil(t, wake)
			return
		}
		var d *doorbell.Drop
		require.True(t, errors.As(err, &d), "%v", err)
		require.Contains(t, doorbell.AllReasons, d.Reason)
	})
}

// A run whose workflow has two send_message steps posts two genuine
// doorbells with the same cause; each wakes the agent once, and the same
// step's doorbell delivered again (in this run or another) is still a
// replay.
// Mutation killed: a replay key without the step (the second step of the
// run dropped as "duplicate"); one with the run too (the other run's
// doorbell for the same step wakes again).
func TestEachSendMessageStepOfARunWakesOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newMemWorld(t, 0)
	def := relaytest.SignEvent(t, w.owner, 30620, `name: Two steps
trigger: {on: message_posted}
steps:
  - {id: first, action: send_message, text: "starting on {{trigger.text}}"}
  - {id: second, action: send_message, text: "now finish {{trigger.text}}"}
`, nostr.Tags{{"d", uuid.NewString()}, w.bell.Tags.First("h")}, 1_900_000_000)
	w.q.events = append(w.q.events, def)
	cause := w.bell.Tags.First("workflow-cause")
	bell := func(run, step string) *nostr.Event {
		return relaytest.SignEvent(t, w.relay, 9, "relay prose, never read", nostr.Tags{
			{"workflow-run", run}, {"workflow-step", step}, {"workflow-owner", w.owner.PublicKeyHex()},
			{"workflow-definition", def.ID, step}, cause, {"p", w.owner.PublicKeyHex()}, w.bell.Tags.First("h"),
			{"buzz:workflow", "doorbell-v1"},
		}, 1_900_000_001)
	}
	v := doorbell.NewVerifier(doorbell.Options{RelayPubkey: w.relay.PublicKeyHex(), AgentPubkey: w.owner.PublicKeyHex(), Query: w.q})
	run := uuid.NewString()

	first, err := v.Verify(ctx, bell(run, "first"))
	require.NoError(t, err)
	requireMemberText(t, first.Prompt, "starting on [member text 1]", `text: "deploy failed on prod"`)
	second, err := v.Verify(ctx, bell(run, "second"))
	require.NoError(t, err, "the run's second send_message step is not a replay of its first")
	requireMemberText(t, second.Prompt, "now finish [member text 1]", `text: "deploy failed on prod"`)

	_, err = v.Verify(ctx, bell(run, "second"))
	requireDrop(t, err, "duplicate")
	_, err = v.Verify(ctx, bell(uuid.NewString(), "first"))
	requireDrop(t, err, "duplicate")
}

// Many deliveries of one doorbell at once (several subscriptions, a relay
// replaying while the first is verified) wake the agent exactly once: the
// replay memory records a cause atomically after the checks.
// Kills: recording the cause without checking it was already recorded.
func TestConcurrentDeliveriesWakeOnce(t *testing.T) {
	t.Parallel()
	w := newMemWorld(t, 0)
	v := doorbell.NewVerifier(doorbell.Options{RelayPubkey: w.relay.PublicKeyHex(), AgentPubkey: w.owner.PublicKeyHex(), Query: w.q})
	const deliveries = 16
	errs := make(chan error, deliveries)
	start := make(chan struct{})
	for range deliveries {
		go func() {
			<-start
			_, err := v.Verify(context.Background(), w.bell)
			errs <- err
		}()
	}
	close(start)
	woken := 0
	for range deliveries {
		if err := <-errs; err == nil {
			woken++
		} else {
			requireDrop(t, err, "duplicate")
		}
	}
	require.Equal(t, 1, woken)
}

// Any workflow pointer or marker makes an event doorbell-shaped, whoever
// signed it and whatever its kind, so it is verified or dropped, never
// read as an ordinary message. Kills: a shape test limited to the marker,
// to kind 9, or to relay-signed events.
func TestIsDoorbellShaped(t *testing.T) {
	t.Parallel()
	w := newMemWorld(t, 0)
	require.True(t, doorbell.IsDoorbellShaped(w.bell))
	for _, tag := range []nostr.Tag{
		{"workflow-run", uuid.NewString()}, {"workflow-definition", "x"}, {"workflow-cause", "event", "x"},
		{"workflow-cargo", "{}"}, {"buzz:workflow", "message-v1"}, {"workflow-owner", w.owner.PublicKeyHex()},
	} {
		for _, kind := range []int{9, 1, 46010} {
			ev := relaytest.SignEvent(t, w.agent, kind, "hi", nostr.Tags{{"h", uuid.NewString()}, tag}, 0)
			require.True(t, doorbell.IsDoorbellShaped(ev), "%v on kind %d", tag, kind)
		}
	}
	plain := relaytest.SignEvent(t, w.agent, 9, "hi @Robby", nostr.Tags{{"h", uuid.NewString()}, {"p", w.owner.PublicKeyHex()}}, 0)
	require.False(t, doorbell.IsDoorbellShaped(plain))
	_, err := w.verifier(w.owner).Verify(context.Background(), relaytest.SignEvent(t, w.agent, 9, "hi", nostr.Tags{{"workflow-run", uuid.NewString()}}, 0))
	requireDrop(t, err, "not_relay")
}

// failingQuerier stands for a relay connection that is down.
type failingQuerier struct{}

func (failingQuerier) Query(context.Context, map[string]any) ([]*nostr.Event, error) {
	return nil, errors.New("connection reset")
}

// A doorbell that could not be checked because the relay could not be
// asked is dropped as temporary and not remembered: verified again once
// the relay answers, it wakes the agent.
// Kills: treating a failed query as an empty answer (definition_missing),
// or remembering the cause of a doorbell that was not verified.
func TestUnavailableRelayIsTemporary(t *testing.T) {
	t.Parallel()
	w := newMemWorld(t, 0)
	q := &switchQuerier{}
	v := doorbell.NewVerifier(doorbell.Options{RelayPubkey: w.relay.PublicKeyHex(), AgentPubkey: w.owner.PublicKeyHex(), Query: q})
	q.q = failingQuerier{}
	_, err := v.Verify(context.Background(), w.bell)
	requireDrop(t, err, "unavailable")
	var d *doorbell.Drop
	require.ErrorAs(t, err, &d)
	require.True(t, d.Temporary())
	q.q = w.q
	_, err = v.Verify(context.Background(), w.bell)
	require.NoError(t, err)
}

type switchQuerier struct{ q doorbell.Querier }

func (s *switchQuerier) Query(ctx context.Context, f map[string]any) ([]*nostr.Event, error) {
	return s.q.Query(ctx, f)
}

// A profile takes part in a mention wake only if its folded name is one of
// the template's candidates (a lookup per member), not if it occurs
// anywhere in the template (a scan of the template per member, which also
// signature-checks every member the template's prose happens to name): in
// a channel of 2,000 members whose names all occur in a 30 KB template
// that mentions one of them, one profile is checked and handed on.
// Mutation killed: the per-member scan (strings.Contains of the folded
// template) hands on all 2,001.
func TestMentionWakeChecksOnlyTheProfilesTheTemplateMentions(t *testing.T) {
	t.Parallel()
	const members = 2_000
	relayKey, robby := relaytest.NewKey(t), relaytest.NewKey(t)
	ch := uuid.New()
	q := &memQuerier{}
	add := func(key *nostr.SecretKey, kind int, content string, tags nostr.Tags) {
		q.events = append(q.events, relaytest.SignEvent(t, key, kind, content, tags, 1_900_000_000))
	}
	list := nostr.Tags{{"d", ch.String()}, {"p", robby.PublicKeyHex()}}
	add(robby, 0, `{"name":"Robby"}`, nil)
	var prose strings.Builder
	for i := range members {
		k := relaytest.NewKey(t)
		list = append(list, nostr.Tag{"p", k.PublicKeyHex()})
		name := "Member " + strconv.Itoa(i)
		add(k, 0, `{"name":"`+name+`"}`, nil)
		prose.WriteString(name + " wrote, ")
	}
	add(relayKey, 39002, "", list)
	template := "@Robby please read what " + prose.String() + "and answer {{trigger.text}}"
	v := doorbell.NewVerifier(doorbell.Options{RelayPubkey: relayKey.PublicKeyHex(), AgentPubkey: robby.PublicKeyHex(), Query: q})

	checked, err := v.MemberNames(context.Background(), ch, template)
	require.NoError(t, err)
	t.Logf("profiles checked for a template of %d bytes in a channel of %d members: %d", len(template), members+1, len(checked))
	require.Equal(t, 1, len(checked), "profiles checked")
	require.Equal(t, "Robby", checked[0])
}
