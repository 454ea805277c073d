package doorbell

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
	"github.com/buzzrelay/buzz/internal/workflow/condition"
	"github.com/buzzrelay/buzz/internal/workflow/mention"
)

// Defaults of Options.
const (
	// DefaultMaxCargoBytes caps a webhook doorbell's cargo tag: the relay's
	// own cap on a webhook body, so honest cargo always fits.
	DefaultMaxCargoBytes = 61440
	// DefaultWebhookBurst and DefaultWebhookRefill give each workflow five
	// immediate webhook wakes, then one more every 12 seconds (five a
	// minute).
	DefaultWebhookBurst  = 5
	DefaultWebhookRefill = 12 * time.Second
	// DefaultDedupeEntries and DefaultDedupeTTL bound the memory of causes
	// already verified: at about 200 bytes each (260 with a step id of the
	// longest, 64 characters), 65536 entries are ~13 MB (at most ~17 MB).
	DefaultDedupeEntries = 65536
	DefaultDedupeTTL     = 7 * 24 * time.Hour
)

// Options configure a Verifier.
type Options struct {
	RelayPubkey string  // hex key the relay signs doorbells with (NIP-11 "self")
	AgentPubkey string  // hex key of the agent being woken
	Query       Querier // reads signed artifacts from the relay
	Now         func() time.Time

	MaxCargoBytes int           // 0: DefaultMaxCargoBytes
	WebhookBurst  int           // 0: DefaultWebhookBurst
	WebhookRefill time.Duration // 0: DefaultWebhookRefill
	DedupeEntries int           // 0: DefaultDedupeEntries
	DedupeTTL     time.Duration // 0: DefaultDedupeTTL
	// Spent are replay keys (Wake.ReplayKey) that woke the agent in an
	// earlier process, with when: they start in the replay memory, so a
	// restart does not let a doorbell already acted on through again. Those
	// older than DedupeTTL are left out.
	Spent map[string]time.Time
}

// Verifier checks doorbells for one agent. It is safe for concurrent use;
// its replay memory and webhook budgets are shared by every call.
type Verifier struct {
	opts    Options
	seen    *seenCauses
	buckets *webhookBuckets
}

// NewVerifier returns a verifier with opts' zero values set to defaults.
func NewVerifier(opts Options) *Verifier {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxCargoBytes <= 0 {
		opts.MaxCargoBytes = DefaultMaxCargoBytes
	}
	if opts.WebhookBurst <= 0 {
		opts.WebhookBurst = DefaultWebhookBurst
	}
	if opts.WebhookRefill <= 0 {
		opts.WebhookRefill = DefaultWebhookRefill
	}
	if opts.DedupeEntries <= 0 {
		opts.DedupeEntries = DefaultDedupeEntries
	}
	if opts.DedupeTTL <= 0 {
		opts.DedupeTTL = DefaultDedupeTTL
	}
	v := &Verifier{
		opts:    opts,
		seen:    newSeenCauses(opts.DedupeEntries, opts.DedupeTTL),
		buckets: newWebhookBuckets(opts.WebhookBurst, opts.WebhookRefill),
	}
	v.seen.preload(opts.Spent, opts.Now())
	opts.Spent = nil // the memory holds them now
	return v
}

// Verify checks a doorbell-shaped event and returns the wake it proves, or
// a *Drop saying why it proves nothing. Checks run in order: the envelope,
// the signed definition and step, the signed cause (and the trigger
// context rebuilt from it), the locally rendered prompt, who may be woken,
// and last the replay memory and the webhook budget, which only a doorbell
// that passed everything else may spend.
func (v *Verifier) Verify(ctx context.Context, ev *nostr.Event) (*Wake, error) {
	wake, d := v.verify(ctx, ev)
	if d != nil {
		return nil, d
	}
	return wake, nil
}

func (v *Verifier) verify(ctx context.Context, ev *nostr.Event) (*Wake, *Drop) {
	env, d := v.readEnvelope(ev)
	if d != nil {
		return nil, d
	}
	// A replay is refused before any round trip to the relay; the key is
	// recorded only once the doorbell has passed every check.
	replayKey := ""
	if env.cause.Kind != workflow.CauseWebhook {
		replayKey = replayKeyOf(env)
		if v.seen.has(replayKey, v.opts.Now()) {
			return nil, dropDuplicate(env)
		}
	}
	defEv, def, step, d := v.definition(ctx, env)
	if d != nil {
		return nil, d
	}
	workflowUUID, _ := uuid.Parse(defEv.DTag()) // checked by definition
	workflowID := workflowUUID.String()
	tc, d := v.cause(ctx, env, defEv, def)
	if d != nil {
		return nil, d
	}
	prompt, d := render(ctx, step, tc, env)
	if d != nil {
		return nil, d
	}
	if d := v.mayWake(ctx, env, step); d != nil {
		return nil, d
	}
	now := v.opts.Now()
	if replayKey != "" && !v.seen.add(replayKey, now) {
		return nil, dropDuplicate(env)
	}
	if env.cause.Kind == workflow.CauseWebhook {
		coordinate := "30620:" + defEv.PubKey + ":" + workflowID
		if !v.buckets.take(coordinate, now) {
			return nil, drop(ReasonRateLimited, "webhook budget of "+coordinate+" spent")
		}
	}
	wake := &Wake{
		RunID:        env.run,
		StepID:       env.step,
		ChannelID:    env.channel.String(),
		Owner:        defEv.PubKey,
		DefinitionID: defEv.ID,
		WorkflowID:   workflowID,
		Cause:        env.cause,
		Prompt:       prompt,
		Message:      ev,
		ReplayKey:    replayKey,
	}
	if step.ReplyInThread && tc.MessageID != "" {
		wake.ReplyTo = tc.MessageID
	}
	return wake, nil
}

// replayKeyOf names what one genuine doorbell proves: this step of this
// definition for this cause. Every send_message step of a run rings once
// for the run's one cause, so the step is part of it; the run is not, so a
// second run for the same cause is still a replay. The step goes last: the
// fields before it are hex, an enum and a number, none containing NUL, so
// no two envelopes share a key.
func replayKeyOf(env *envelope) string {
	return env.definitionID + "\x00" + env.cause.Kind + "\x00" + env.cause.Value + "\x00" + env.step
}

func dropDuplicate(env *envelope) *Drop {
	return drop(ReasonDuplicate, env.cause.Kind+" "+env.cause.Value+" already woke this agent for step "+env.step+" of this definition")
}

// fetchByID asks the relay for the one event with id. Anything but exactly
// that event (nothing, another id) is absent.
func (v *Verifier) fetchByID(ctx context.Context, id string) (*nostr.Event, *Drop) {
	events, err := v.opts.Query.Query(ctx, map[string]any{"ids": []string{id}, "limit": 1})
	if err != nil {
		return nil, drop(ReasonUnavailable, "fetching "+id+": "+err.Error())
	}
	for _, e := range events {
		if e != nil && e.ID == id {
			return e, nil
		}
	}
	return nil, nil
}

// definition refetches the signed definition by its exact id and checks it
// names this doorbell's owner, channel and a send_message step.
func (v *Verifier) definition(ctx context.Context, env *envelope) (*nostr.Event, *workflow.Definition, *workflow.Step, *Drop) {
	defEv, d := v.fetchByID(ctx, env.definitionID)
	if d != nil {
		return nil, nil, nil, d
	}
	if defEv == nil {
		return nil, nil, nil, drop(ReasonDefinitionMissing, "definition "+env.definitionID+" is not stored")
	}
	if err := defEv.Verify(); err != nil {
		return nil, nil, nil, drop(ReasonDefinitionForged, "definition: "+err.Error())
	}
	if defEv.Kind != workflow.KindDefinition {
		return nil, nil, nil, drop(ReasonDefinitionForged, "definition event is not a workflow definition")
	}
	if defEv.PubKey != env.owner {
		return nil, nil, nil, drop(ReasonDefinitionForged, "definition signed by "+defEv.PubKey+", not the claimed owner "+env.owner)
	}
	if h, err := uuid.Parse(tagValue(defEv, "h")); err != nil || h != env.channel {
		return nil, nil, nil, drop(ReasonDefinitionMismatch, "definition belongs to another channel")
	}
	if _, err := uuid.Parse(defEv.DTag()); err != nil {
		return nil, nil, nil, drop(ReasonDefinitionMismatch, "definition has no workflow UUID in d")
	}
	def, err := workflow.Parse(defEv.Content)
	if err != nil {
		return nil, nil, nil, drop(ReasonDefinitionInvalid, err.Error())
	}
	_, step := def.StepByID(env.step)
	if step == nil {
		return nil, nil, nil, drop(ReasonStepMismatch, "the definition has no step "+env.step)
	}
	if step.Action != workflow.ActionSendMessage {
		return nil, nil, nil, drop(ReasonStepMismatch, "step "+env.step+" is "+step.Action+", not send_message")
	}
	// A literal channel is checked here; a templated one renders to the
	// workflow's own channel or the definition check above already failed.
	if step.Channel != "" && !strings.Contains(step.Channel, "{{") {
		if ch, err := uuid.Parse(step.Channel); err != nil || ch != env.channel {
			return nil, nil, nil, drop(ReasonChannelMismatch, "step posts to "+step.Channel+", the message is in "+env.channel.String())
		}
	}
	return defEv, def, step, nil
}

func tagValue(ev *nostr.Event, name string) string {
	if t := ev.Tags.First(name); t != nil {
		return t[1]
	}
	return ""
}

// mayWake: the owner is always woken; anyone else only if the unrendered,
// owner-signed template names them, resolved against the channel's
// members exactly as the relay resolves it.
func (v *Verifier) mayWake(ctx context.Context, env *envelope, step *workflow.Step) *Drop {
	if v.opts.AgentPubkey == env.owner {
		return nil
	}
	members, d := v.members(ctx, env.channel, step.Text)
	if d != nil {
		return d
	}
	for _, pk := range mention.Resolve(step.Text, members, env.owner) {
		if pk == v.opts.AgentPubkey {
			return nil
		}
	}
	return drop(ReasonNotMentioned, "the signed template does not name this agent")
}

// members reads the channel's relay-signed member list (kind 39002) and
// each member's newest profile (kind 0) for their display name. Only the
// profiles whose name occurs in the template (case-folded as the mention
// rules fold it) can take part in a mention, so only theirs need their
// signature checked; an unchecked or forged profile counts as absent,
// which the relay could achieve anyway by leaving it out.
func (v *Verifier) members(ctx context.Context, channel uuid.UUID, text string) ([]mention.Member, *Drop) {
	lists, err := v.opts.Query.Query(ctx, map[string]any{
		"kinds": []int{ingest.KindGroupMembers}, "authors": []string{v.opts.RelayPubkey}, "#d": []string{channel.String()}, "limit": 1,
	})
	if err != nil {
		return nil, drop(ReasonUnavailable, "fetching the member list: "+err.Error())
	}
	var list *nostr.Event
	for _, e := range lists {
		if e == nil || e.Kind != ingest.KindGroupMembers || e.PubKey != v.opts.RelayPubkey || e.DTag() != channel.String() || e.Verify() != nil {
			continue
		}
		if list == nil || e.CreatedAt > list.CreatedAt {
			list = e
		}
	}
	if list == nil {
		return nil, drop(ReasonMembersUnverified, "no relay-signed member list for the channel")
	}
	isMember := map[string]bool{}
	var pubkeys []string
	for _, pk := range list.Tags.Values("p") {
		if nostr.IsHex64(pk) && !isMember[pk] {
			isMember[pk] = true
			pubkeys = append(pubkeys, pk)
		}
	}
	newest := map[string]*nostr.Event{}
	for start := 0; start < len(pubkeys); start += profileBatch {
		batch := pubkeys[start:min(start+profileBatch, len(pubkeys))]
		profiles, err := v.opts.Query.Query(ctx, map[string]any{"kinds": []int{0}, "authors": batch, "limit": len(batch)})
		if err != nil {
			return nil, drop(ReasonUnavailable, "fetching profiles: "+err.Error())
		}
		for _, p := range profiles {
			if p == nil || p.Kind != 0 || !isMember[p.PubKey] {
				continue
			}
			if prev := newest[p.PubKey]; prev == nil || p.CreatedAt > prev.CreatedAt {
				newest[p.PubKey] = p
			}
		}
	}
	named := mayBeNamed(text)
	members := make([]mention.Member, 0, len(newest))
	for _, pk := range pubkeys {
		p := newest[pk]
		if p == nil {
			continue
		}
		name := ingest.ProfileDisplayName(p.Content)
		if name == "" || !named(name) || p.Verify() != nil {
			continue
		}
		members = append(members, mention.Member{Pubkey: pk, DisplayName: name})
	}
	return members, nil
}

// mayBeNamed reports whether a display name could take part in resolving
// template's mentions: whether, folded, it is one of the template's
// candidates (a lookup, whatever the template's length), or for a
// template with too many of them, whether it occurs in the folded
// template at all (a scan of the template per member).
func mayBeNamed(template string) func(name string) bool {
	candidates, ok := mention.Candidates(template)
	if !ok {
		folded := mention.Fold(template)
		return func(name string) bool { return strings.Contains(folded, mention.Fold(name)) }
	}
	isCandidate := make(map[string]bool, len(candidates))
	for _, c := range candidates {
		isCandidate[c] = true
	}
	return func(name string) bool { return isCandidate[mention.Fold(name)] }
}

// profileBatch is how many authors one profile query names; it stays well
// under a relay's per-filter limit.
const profileBatch = 200

// decodeCargo reads a webhook cargo tag: a JSON object of strings.
func decodeCargo(raw string) (map[string]string, bool) {
	var fields map[string]string
	if err := json.Unmarshal([]byte(raw), &fields); err != nil || fields == nil {
		return nil, false
	}
	return fields, true
}

// readsSteps reports whether a condition reads an earlier step's output.
func readsSteps(expr string) (bool, error) {
	prog, err := condition.Compile(expr)
	if err != nil {
		return false, err
	}
	for _, name := range prog.Variables() {
		if strings.HasPrefix(name, "steps_") {
			return true, nil
		}
	}
	return false, nil
}
