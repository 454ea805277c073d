package doorbell

// Reasons a doorbell is dropped. Each is a short stable word, used as a
// metric label and in the log; AllReasons lists them for dashboards and
// tests. docs/agents.md says when each one happens.
const (
	ReasonBadSignature       = "bad_signature"       // the doorbell's own id or signature does not verify
	ReasonNotRelay           = "not_relay"           // not signed by this relay's key
	ReasonWrongKind          = "wrong_kind"          // doorbell-shaped, but not a kind 9 message
	ReasonMalformed          = "malformed"           // a pointer tag missing, repeated or ill-formed, or an unknown marker or cause
	ReasonNotAddressed       = "not_addressed"       // this agent is not p-tagged
	ReasonUnavailable        = "unavailable"         // the relay could not be asked (the doorbell may be retried)
	ReasonDefinitionMissing  = "definition_missing"  // no stored event has the definition id (deleted or replaced)
	ReasonDefinitionForged   = "definition_forged"   // bad signature, not kind 30620, or not signed by the claimed owner
	ReasonDefinitionMismatch = "definition_mismatch" // another channel, or no workflow UUID in d
	ReasonDefinitionInvalid  = "definition_invalid"  // the signed YAML does not parse
	ReasonStepMismatch       = "step_mismatch"       // the named step is missing or is not send_message
	ReasonChannelMismatch    = "channel_mismatch"    // the step's literal channel is not the message's channel
	ReasonCauseMissing       = "cause_missing"       // the cause event is not stored
	ReasonCauseForged        = "cause_forged"        // the cause event's id or signature does not verify
	ReasonCauseMismatch      = "cause_mismatch"      // the cause does not belong to this workflow's trigger or channel
	ReasonCauseUnauthorized  = "cause_unauthorized"  // a command signed by someone other than the owner
	ReasonSelfCaused         = "self_caused"         // the cause event is this agent's own (its answer, say)
	ReasonWorkflowLoop       = "workflow_loop"       // the cause event is an agent's answer to a doorbell of the same workflow
	ReasonTriggerNotMatched  = "trigger_not_matched" // the trigger's emoji or filter does not match the rebuilt context
	ReasonOffSlot            = "off_slot"            // a schedule slot that is no occurrence of the signed schedule
	ReasonStepsReference     = "steps_reference"     // the template or condition reads earlier steps' outputs
	ReasonUnresolved         = "unresolved"          // a placeholder the verified context cannot fill
	ReasonTemplateError      = "template_error"      // the signed template cannot be rendered
	ReasonConditionFalse     = "condition_false"     // the step's if is false (or fails) on the rebuilt context
	ReasonCargoOversize      = "cargo_oversize"      // webhook cargo larger than the cap
	ReasonCargoMalformed     = "cargo_malformed"     // cargo that is not a JSON object of strings, or on a non-webhook cause
	ReasonUndeclaredCargo    = "undeclared_cargo"    // a cargo key the signed template does not declare
	ReasonDuplicate          = "duplicate"           // this definition and cause were already verified
	ReasonRateLimited        = "rate_limited"        // the workflow's webhook budget is spent
	ReasonMembersUnverified  = "members_unverified"  // the channel's relay-signed member list is missing or forged
	ReasonNotMentioned       = "not_mentioned"       // this agent is neither the owner nor named by the signed template
)

// AllReasons lists every drop reason.
var AllReasons = []string{
	ReasonBadSignature, ReasonNotRelay, ReasonWrongKind, ReasonMalformed, ReasonNotAddressed, ReasonUnavailable,
	ReasonDefinitionMissing, ReasonDefinitionForged, ReasonDefinitionMismatch, ReasonDefinitionInvalid,
	ReasonStepMismatch, ReasonChannelMismatch, ReasonCauseMissing, ReasonCauseForged, ReasonCauseMismatch,
	ReasonCauseUnauthorized, ReasonSelfCaused, ReasonWorkflowLoop, ReasonTriggerNotMatched, ReasonOffSlot, ReasonStepsReference, ReasonUnresolved,
	ReasonTemplateError, ReasonConditionFalse, ReasonCargoOversize, ReasonCargoMalformed, ReasonUndeclaredCargo,
	ReasonDuplicate, ReasonRateLimited, ReasonMembersUnverified, ReasonNotMentioned,
}

func drop(reason, detail string) *Drop { return &Drop{Reason: reason, Detail: detail} }
