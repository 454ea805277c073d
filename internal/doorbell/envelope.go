package doorbell

import (
	"strconv"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// Tag names of a doorbell: pointers to the signed artifacts an agent
// verifies, and the marker.
const (
	tagRun        = "workflow-run"
	tagStep       = "workflow-step"
	tagOwner      = "workflow-owner"
	tagDefinition = "workflow-definition"
	tagCause      = "workflow-cause"
	tagCargo      = "workflow-cargo"
	tagMarker     = "buzz:workflow"
)

// shapeTags are the tags that make an event doorbell-shaped.
var shapeTags = []string{tagRun, tagStep, tagOwner, tagDefinition, tagCause, tagCargo, tagMarker}

// IsDoorbellShaped reports whether ev claims to be a workflow doorbell: it
// carries any workflow pointer tag or the buzz:workflow marker, whatever its
// kind, signer or marker value. Such an event goes to Verify and nowhere
// else: one that fails is dropped, never handled as an ordinary message, so
// neither a forgery nor an older relay's unverifiable message reaches an
// agent as if a person had written it.
func IsDoorbellShaped(ev *nostr.Event) bool {
	for _, tag := range ev.Tags {
		if len(tag) == 0 {
			continue
		}
		for _, name := range shapeTags {
			if tag[0] == name {
				return true
			}
		}
	}
	return false
}

// envelope is what the doorbell's own tags claim; nothing in it is
// authority until the signed artifacts confirm it.
type envelope struct {
	run          string
	step         string
	owner        string // claimed; confirmed by the definition's signature
	definitionID string
	cause        Cause
	channel      uuid.UUID
	cargo        string // raw workflow-cargo value, "" when absent
	hasCargo     bool
}

// readEnvelope checks the doorbell's own signature and tags: exactly one of
// each pointer, well formed, and this agent p-tagged.
func (v *Verifier) readEnvelope(ev *nostr.Event) (*envelope, *Drop) {
	if err := ev.Verify(); err != nil {
		return nil, drop(ReasonBadSignature, "doorbell: "+err.Error())
	}
	if ev.PubKey != v.opts.RelayPubkey {
		return nil, drop(ReasonNotRelay, "doorbell signed by "+ev.PubKey+", not the relay")
	}
	if ev.Kind != 9 {
		return nil, drop(ReasonWrongKind, "doorbell of kind "+strconv.Itoa(ev.Kind))
	}
	one := func(name string) (nostr.Tag, *Drop) {
		var found nostr.Tag
		for _, tag := range ev.Tags {
			if len(tag) == 0 || tag[0] != name {
				continue
			}
			if found != nil {
				return nil, drop(ReasonMalformed, "more than one "+name+" tag")
			}
			found = tag
		}
		if len(found) < 2 {
			return nil, drop(ReasonMalformed, "no "+name+" tag with a value")
		}
		return found, nil
	}
	var env envelope
	tags := map[string]nostr.Tag{}
	for _, name := range []string{tagRun, tagStep, tagOwner, tagDefinition, tagCause, "h", tagMarker} {
		tag, d := one(name)
		if d != nil {
			return nil, d
		}
		tags[name] = tag
	}
	if _, err := uuid.Parse(tags[tagRun][1]); err != nil {
		return nil, drop(ReasonMalformed, "workflow-run is not a UUID")
	}
	env.run = tags[tagRun][1]
	env.step = tags[tagStep][1]
	if !nostr.IsHex64(tags[tagOwner][1]) {
		return nil, drop(ReasonMalformed, "workflow-owner is not a 64-hex pubkey")
	}
	env.owner = tags[tagOwner][1]
	def := tags[tagDefinition]
	if len(def) != 3 || !nostr.IsHex64(def[1]) || def[2] != env.step {
		return nil, drop(ReasonMalformed, "workflow-definition must be [id, step] naming the workflow-step")
	}
	env.definitionID = def[1]
	if tags[tagMarker][1] != workflow.DoorbellMarker {
		return nil, drop(ReasonMalformed, "marker "+strconv.Quote(tags[tagMarker][1])+" is not "+workflow.DoorbellMarker)
	}
	channel, err := uuid.Parse(tags["h"][1])
	if err != nil {
		return nil, drop(ReasonMalformed, "h is not a channel UUID")
	}
	env.channel = channel
	cause := tags[tagCause]
	if len(cause) != 3 {
		return nil, drop(ReasonMalformed, "workflow-cause must be [type, value]")
	}
	env.cause = Cause{Kind: cause[1], Value: cause[2]}
	switch env.cause.Kind {
	case workflow.CauseEvent, workflow.CauseCommand:
		if !nostr.IsHex64(env.cause.Value) {
			return nil, drop(ReasonMalformed, env.cause.Kind+" cause is not a 64-hex event id")
		}
	case workflow.CauseSchedule:
		if _, ok := parseSlot(env.cause.Value); !ok {
			return nil, drop(ReasonMalformed, "schedule cause is not a slot in Unix seconds")
		}
	case workflow.CauseWebhook:
		if env.cause.Value != "" {
			return nil, drop(ReasonMalformed, "webhook cause carries a value")
		}
	default:
		return nil, drop(ReasonMalformed, "unknown cause type "+strconv.Quote(env.cause.Kind))
	}
	for _, tag := range ev.Tags {
		if len(tag) == 0 || tag[0] != tagCargo {
			continue
		}
		if env.hasCargo || len(tag) != 2 {
			return nil, drop(ReasonCargoMalformed, "workflow-cargo must be one [name, JSON] tag")
		}
		env.hasCargo, env.cargo = true, tag[1]
	}
	if env.hasCargo && env.cause.Kind != workflow.CauseWebhook {
		return nil, drop(ReasonCargoMalformed, "cargo on a "+env.cause.Kind+" cause")
	}
	// Checked before the cargo is parsed, so an oversize tag costs nothing.
	if len(env.cargo) > v.opts.MaxCargoBytes {
		return nil, drop(ReasonCargoOversize, strconv.Itoa(len(env.cargo))+" bytes of cargo, the cap is "+strconv.Itoa(v.opts.MaxCargoBytes))
	}
	addressed := false
	for _, pk := range ev.Tags.Values("p") {
		if pk == v.opts.AgentPubkey {
			addressed = true
			break
		}
	}
	if !addressed {
		return nil, drop(ReasonNotAddressed, "this agent is not p-tagged")
	}
	return &env, nil
}

// parseSlot reads a schedule slot: canonical decimal Unix seconds (no sign,
// no leading zero), as the relay writes it.
func parseSlot(s string) (int64, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || strconv.FormatInt(n, 10) != s {
		return 0, false
	}
	return n, true
}
