package doorbell

import (
	"context"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// cause refetches and checks the doorbell's cause and rebuilds, from signed
// data only, the trigger context the relay ran the step with.
func (v *Verifier) cause(ctx context.Context, env *envelope, defEv *nostr.Event, def *workflow.Definition) (workflow.TriggerContext, *Drop) {
	tc := workflow.TriggerContext{
		ChannelID:         env.channel.String(),
		WebhookFields:     map[string]string{},
		DefinitionEventID: defEv.ID,
		Cause:             workflow.Cause{Kind: env.cause.Kind, Ref: env.cause.Value},
	}
	switch env.cause.Kind {
	case workflow.CauseEvent:
		return v.eventCause(ctx, env, WorkflowCoordinate(defEv.PubKey, defEv.DTag()), def, tc)
	case workflow.CauseCommand:
		return v.commandCause(ctx, env, defEv, tc)
	case workflow.CauseSchedule:
		if def.Trigger.On != workflow.OnSchedule {
			return tc, drop(ReasonCauseMismatch, "a schedule cause for a "+def.Trigger.On+" trigger")
		}
		slot, _ := parseSlot(env.cause.Value)
		at := time.Unix(slot, 0).UTC()
		// Exactly one slot of the signed schedule in (slot-1s, slot]: the
		// slot is an occurrence of the cron expression (to the second) or a
		// multiple of the interval since the epoch, as the relay fires them.
		if len(workflow.Slots(def.Trigger, at.Add(-time.Second), at)) != 1 {
			return tc, drop(ReasonOffSlot, "slot "+env.cause.Value+" is not an occurrence of the signed schedule")
		}
		tc.Timestamp = env.cause.Value
		return tc, nil
	default: // webhook; readEnvelope admits no other
		if def.Trigger.On != workflow.OnWebhook {
			return tc, drop(ReasonCauseMismatch, "a webhook cause for a "+def.Trigger.On+" trigger")
		}
		if env.hasCargo {
			fields, ok := decodeCargo(env.cargo)
			if !ok {
				return tc, drop(ReasonCargoMalformed, "cargo is not a JSON object of strings")
			}
			tc.WebhookFields = fields
		}
		return tc, nil
	}
}

// eventCause: the message, reaction or diff that fired the run, in this
// channel, of the trigger's kind, matching its emoji and filter, and not an
// agent's answer to a doorbell of the same workflow (coordinate).
func (v *Verifier) eventCause(ctx context.Context, env *envelope, coordinate string, def *workflow.Definition, tc workflow.TriggerContext) (workflow.TriggerContext, *Drop) {
	src, d := v.fetchByID(ctx, env.cause.Value)
	if d != nil {
		return tc, d
	}
	if src == nil {
		return tc, drop(ReasonCauseMissing, "cause event "+env.cause.Value+" is not stored")
	}
	if err := src.Verify(); err != nil {
		return tc, drop(ReasonCauseForged, "cause event: "+err.Error())
	}
	if src.PubKey == v.opts.RelayPubkey {
		// The relay's own events never fire workflows.
		return tc, drop(ReasonCauseMismatch, "the cause event is relay-signed")
	}
	if src.PubKey == v.opts.AgentPubkey {
		// The agent's own answers are messages in the channel too: a
		// workflow that rings it on every message would otherwise have it
		// answer its answers without end.
		return tc, drop(ReasonSelfCaused, "the cause event is this agent's own")
	}
	if slices.Contains(src.Tags.Values(TagAnswers), coordinate) {
		// Another agent's answer to this workflow's doorbell: two agents
		// a workflow rings on every message would otherwise answer each
		// other's answers without end.
		return tc, drop(ReasonWorkflowLoop, "the cause event answers a doorbell of "+coordinate)
	}
	if h, err := uuid.Parse(tagValue(src, "h")); err != nil || h != env.channel {
		return tc, drop(ReasonCauseMismatch, "the cause event is not in the message's channel")
	}
	want := map[string]int{workflow.OnMessagePosted: 9, workflow.OnReactionAdded: 7, workflow.OnDiffPosted: 40008}[def.Trigger.On]
	if want == 0 || src.Kind != want {
		return tc, drop(ReasonCauseMismatch, "a kind "+strconv.Itoa(src.Kind)+" event cannot fire a "+def.Trigger.On+" trigger")
	}
	rebuilt := workflow.EventContext(src, env.channel)
	rebuilt.DefinitionEventID = tc.DefinitionEventID
	if !workflow.Fires(ctx, def, src.Kind, rebuilt, workflow.EvalCondition) {
		return tc, drop(ReasonTriggerNotMatched, "the trigger's emoji or filter does not match the cause event")
	}
	return rebuilt, nil
}

// commandCause: the owner's signed manual command naming this workflow.
// Its content is never read.
func (v *Verifier) commandCause(ctx context.Context, env *envelope, defEv *nostr.Event, tc workflow.TriggerContext) (workflow.TriggerContext, *Drop) {
	cmd, d := v.fetchByID(ctx, env.cause.Value)
	if d != nil {
		return tc, d
	}
	if cmd == nil {
		return tc, drop(ReasonCauseMissing, "command "+env.cause.Value+" is not stored")
	}
	if err := cmd.Verify(); err != nil {
		return tc, drop(ReasonCauseForged, "command: "+err.Error())
	}
	if cmd.Kind != workflow.KindManualTrigger {
		return tc, drop(ReasonCauseMismatch, "the command cause is a kind "+strconv.Itoa(cmd.Kind)+" event")
	}
	target := cmd.Tags.First("d")
	if target == nil {
		target = cmd.Tags.First("e")
	}
	workflowID, _ := uuid.Parse(defEv.DTag())
	if target == nil {
		return tc, drop(ReasonCauseMismatch, "the command names no workflow")
	}
	if id, err := uuid.Parse(target[1]); err != nil || id != workflowID {
		return tc, drop(ReasonCauseMismatch, "the command names another workflow")
	}
	// Only the owner may run their workflow by command. (An agent owner's
	// attested human owner is not accepted: the relay refuses their
	// commands too.)
	if cmd.PubKey != defEv.PubKey {
		return tc, drop(ReasonCauseUnauthorized, "command signed by "+cmd.PubKey+", not the workflow owner")
	}
	tc.Author = cmd.PubKey
	tc.Timestamp = strconv.FormatInt(cmd.CreatedAt, 10)
	return tc, nil
}
