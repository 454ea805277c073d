package trace

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/google/uuid"
)

// SchemaVersion is the value of TraceStep.SchemaVersion written by this package.
const SchemaVersion = 1

// CommunityLabel names a community by its UUID in canonical string form.
type CommunityLabel string

// HostLabel names the host a connection is bound to.
type HostLabel string

// ChannelLabel names a channel by its UUID in canonical string form.
type ChannelLabel string

// ActorLabel names an actor by the first 16 hex characters of its pubkey.
type ActorLabel string

// OpaqueID names an event by the first 8 bytes of its id, as 16 hex characters.
type OpaqueID string

// CommunityLabelFor returns the label of community id.
func CommunityLabelFor(id uuid.UUID) CommunityLabel { return CommunityLabel(id.String()) }

// ChannelLabelFor returns the label of channel id.
func ChannelLabelFor(id uuid.UUID) ChannelLabel { return ChannelLabel(id.String()) }

// ActorLabelFor returns the label of the actor with the given hex pubkey.
func ActorLabelFor(pubkeyHex string) ActorLabel { return ActorLabel(hexPrefix16(pubkeyHex)) }

// OpaqueIDFor returns the opaque label of the event with the given hex id.
func OpaqueIDFor(eventIDHex string) OpaqueID { return OpaqueID(hexPrefix16(eventIDHex)) }

// hexPrefix16 returns the first 16 characters (8 bytes) of a hex string,
// lowercased. Shorter input is returned whole.
func hexPrefix16(s string) string {
	if len(s) > 16 {
		s = s[:16]
	}
	return strings.ToLower(s)
}

// Verdict is the outcome of an authorization check.
type Verdict string

// Verdicts.
const (
	VerdictAllow Verdict = "allow"
	VerdictDeny  Verdict = "deny"
)

// SanitizedReason is the client-visible class of a rejected request.
type SanitizedReason string

// Sanitized reasons.
const (
	ReasonRestricted  SanitizedReason = "restricted"
	ReasonInvalid     SanitizedReason = "invalid"
	ReasonServerError SanitizedReason = "server_error"
)

// AbstractState is the abstract request state a step leaves behind.
type AbstractState struct {
	ResolvedCommunity CommunityLabel `json:"resolved_community"`
	BoundHost         HostLabel      `json:"bound_host"`
	Actor             ActorLabel     `json:"actor"`
}

// TraceStep is one recorded action together with the state after it.
type TraceStep struct {
	SchemaVersion int           `json:"schema_version"`
	Action        TraceAction   `json:"action"`
	StateAfter    AbstractState `json:"state_after"`
}

// NewStep returns a step at the current SchemaVersion.
func NewStep(action TraceAction, stateAfter AbstractState) TraceStep {
	return TraceStep{SchemaVersion: SchemaVersion, Action: action, StateAfter: stateAfter}
}

// UnmarshalJSON decodes a step, resolving the action by its type discriminator.
func (s *TraceStep) UnmarshalJSON(data []byte) error {
	var raw struct {
		SchemaVersion int             `json:"schema_version"`
		Action        json.RawMessage `json:"action"`
		StateAfter    AbstractState   `json:"state_after"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	action, err := UnmarshalAction(raw.Action)
	if err != nil {
		return err
	}
	*s = TraceStep{SchemaVersion: raw.SchemaVersion, Action: action, StateAfter: raw.StateAfter}
	return nil
}

// Action type discriminators, as written in the JSON "type" field.
const (
	ActionWriteInsert       = "write_insert"
	ActionWriteInsertGlobal = "write_insert_global"
	ActionWriteDuplicate    = "write_duplicate"
	ActionSanitizedError    = "sanitized_error"
	ActionAuthCheck         = "auth_check"
	ActionReadMessageRows   = "read_message_rows"
	ActionReadByIDRows      = "read_by_id_rows"
	ActionReadHostFeedRows  = "read_host_feed_rows"
	ActionImplBug           = "impl_bug"
)

// TraceAction is the closed set of recordable actions. Its JSON form is an
// object whose "type" field holds the action's discriminator (ActionType)
// followed by the action's snake_case fields. All actions are critical.
type TraceAction interface {
	ActionType() string
	isTraceAction()
}

// WriteInsert records a channel-scoped event insert.
type WriteInsert struct {
	MsgID            OpaqueID        `json:"msg_id"`
	Channel          ChannelLabel    `json:"channel"`
	ClaimedCommunity *CommunityLabel `json:"claimed_community,omitempty"`
}

// WriteInsertGlobal records a channel-less event insert.
type WriteInsertGlobal struct {
	MsgID            OpaqueID        `json:"msg_id"`
	ClaimedCommunity *CommunityLabel `json:"claimed_community,omitempty"`
}

// WriteDuplicate records a write that found the event already stored.
type WriteDuplicate struct {
	MsgID            OpaqueID        `json:"msg_id"`
	Channel          ChannelLabel    `json:"channel"`
	ClaimedCommunity *CommunityLabel `json:"claimed_community,omitempty"`
}

// SanitizedError records a rejection as the client sees it.
type SanitizedError struct {
	Reason SanitizedReason `json:"reason"`
}

// AuthCheck records a channel authorization decision.
type AuthCheck struct {
	Channel          ChannelLabel    `json:"channel"`
	ClaimedCommunity *CommunityLabel `json:"claimed_community,omitempty"`
	Verdict          Verdict         `json:"verdict"`
}

// ReadMessageRows records the true communities of rows returned by a
// (non-search) message read. Channel is the filter's channel, if any.
type ReadMessageRows struct {
	Channel        *ChannelLabel    `json:"channel,omitempty"`
	RowCommunities []CommunityLabel `json:"row_communities"`
}

// ReadByIDRows records the true communities of rows hydrated by id (the
// search lane).
type ReadByIDRows struct {
	Channel        *ChannelLabel    `json:"channel,omitempty"`
	RowCommunities []CommunityLabel `json:"row_communities"`
}

// ReadHostFeedRows records the true communities of rows in a host feed read.
type ReadHostFeedRows struct {
	RowCommunities []CommunityLabel `json:"row_communities"`
}

// ImplBug records an implementation bug detected by the seam itself, such as a
// request that exited without emitting or a lookup coverage breach.
type ImplBug struct {
	Kind string `json:"kind"`
}

func (WriteInsert) ActionType() string       { return ActionWriteInsert }
func (WriteInsertGlobal) ActionType() string { return ActionWriteInsertGlobal }
func (WriteDuplicate) ActionType() string    { return ActionWriteDuplicate }
func (SanitizedError) ActionType() string    { return ActionSanitizedError }
func (AuthCheck) ActionType() string         { return ActionAuthCheck }
func (ReadMessageRows) ActionType() string   { return ActionReadMessageRows }
func (ReadByIDRows) ActionType() string      { return ActionReadByIDRows }
func (ReadHostFeedRows) ActionType() string  { return ActionReadHostFeedRows }
func (ImplBug) ActionType() string           { return ActionImplBug }

func (WriteInsert) isTraceAction()       {}
func (WriteInsertGlobal) isTraceAction() {}
func (WriteDuplicate) isTraceAction()    {}
func (SanitizedError) isTraceAction()    {}
func (AuthCheck) isTraceAction()         {}
func (ReadMessageRows) isTraceAction()   {}
func (ReadByIDRows) isTraceAction()      {}
func (ReadHostFeedRows) isTraceAction()  {}
func (ImplBug) isTraceAction()           {}

// MarshalJSON implements json.Marshaler.
func (a WriteInsert) MarshalJSON() ([]byte, error) {
	type fields WriteInsert
	return marshalTagged(a.ActionType(), fields(a))
}

// MarshalJSON implements json.Marshaler.
func (a WriteInsertGlobal) MarshalJSON() ([]byte, error) {
	type fields WriteInsertGlobal
	return marshalTagged(a.ActionType(), fields(a))
}

// MarshalJSON implements json.Marshaler.
func (a WriteDuplicate) MarshalJSON() ([]byte, error) {
	type fields WriteDuplicate
	return marshalTagged(a.ActionType(), fields(a))
}

// MarshalJSON implements json.Marshaler.
func (a SanitizedError) MarshalJSON() ([]byte, error) {
	type fields SanitizedError
	return marshalTagged(a.ActionType(), fields(a))
}

// MarshalJSON implements json.Marshaler.
func (a AuthCheck) MarshalJSON() ([]byte, error) {
	type fields AuthCheck
	return marshalTagged(a.ActionType(), fields(a))
}

// MarshalJSON implements json.Marshaler. A nil RowCommunities is written as [].
func (a ReadMessageRows) MarshalJSON() ([]byte, error) {
	type fields ReadMessageRows
	a.RowCommunities = nonNil(a.RowCommunities)
	return marshalTagged(a.ActionType(), fields(a))
}

// MarshalJSON implements json.Marshaler. A nil RowCommunities is written as [].
func (a ReadByIDRows) MarshalJSON() ([]byte, error) {
	type fields ReadByIDRows
	a.RowCommunities = nonNil(a.RowCommunities)
	return marshalTagged(a.ActionType(), fields(a))
}

// MarshalJSON implements json.Marshaler. A nil RowCommunities is written as [].
func (a ReadHostFeedRows) MarshalJSON() ([]byte, error) {
	type fields ReadHostFeedRows
	a.RowCommunities = nonNil(a.RowCommunities)
	return marshalTagged(a.ActionType(), fields(a))
}

// MarshalJSON implements json.Marshaler.
func (a ImplBug) MarshalJSON() ([]byte, error) {
	type fields ImplBug
	return marshalTagged(a.ActionType(), fields(a))
}

func nonNil(labels []CommunityLabel) []CommunityLabel {
	if labels == nil {
		return []CommunityLabel{}
	}
	return labels
}

// marshalTagged encodes fields (a struct without MarshalJSON) as a JSON object
// and prepends the "type" discriminator to it.
func marshalTagged(typ string, fields any) ([]byte, error) {
	body, err := json.Marshal(fields)
	if err != nil {
		return nil, err
	}
	if len(body) < 2 || body[0] != '{' {
		return nil, fmt.Errorf("trace: action %s did not encode as an object", typ)
	}
	tag, err := json.Marshal(typ)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	buf.Grow(len(body) + len(tag) + 10)
	buf.WriteString(`{"type":`)
	buf.Write(tag)
	if rest := body[1:]; rest[0] != '}' {
		buf.WriteByte(',')
		buf.Write(rest)
	} else {
		buf.WriteByte('}')
	}
	return buf.Bytes(), nil
}

// UnmarshalAction decodes a JSON action object, selecting the concrete type by
// its "type" discriminator. An unknown or missing discriminator is an error.
func UnmarshalAction(data []byte) (TraceAction, error) {
	var head struct {
		Type *string `json:"type"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("trace: decode action: %w", err)
	}
	if head.Type == nil {
		return nil, fmt.Errorf("trace: decode action: missing \"type\"")
	}
	switch *head.Type {
	case ActionWriteInsert:
		return decodeFields[WriteInsert](data)
	case ActionWriteInsertGlobal:
		return decodeFields[WriteInsertGlobal](data)
	case ActionWriteDuplicate:
		return decodeFields[WriteDuplicate](data)
	case ActionSanitizedError:
		return decodeFields[SanitizedError](data)
	case ActionAuthCheck:
		return decodeFields[AuthCheck](data)
	case ActionReadMessageRows:
		return decodeFields[ReadMessageRows](data)
	case ActionReadByIDRows:
		return decodeFields[ReadByIDRows](data)
	case ActionReadHostFeedRows:
		return decodeFields[ReadHostFeedRows](data)
	case ActionImplBug:
		return decodeFields[ImplBug](data)
	default:
		return nil, fmt.Errorf("trace: decode action: unknown type %q", *head.Type)
	}
}

// decodeFields decodes data into an action of type A. The action types define
// MarshalJSON but not UnmarshalJSON, so plain decoding applies; the "type"
// field is ignored as it has no matching struct field.
func decodeFields[A TraceAction](data []byte) (TraceAction, error) {
	var a A
	if err := json.Unmarshal(data, &a); err != nil {
		return nil, fmt.Errorf("trace: decode %s: %w", a.ActionType(), err)
	}
	return a, nil
}
