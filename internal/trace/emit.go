package trace

import (
	"fmt"
	"strings"

	"github.com/google/uuid"
)

// StateForRequest returns the abstract state of a request resolved to
// communityID on host by the actor with the given hex pubkey.
func StateForRequest(communityID uuid.UUID, host string, pubkeyHex string) AbstractState {
	return AbstractState{
		ResolvedCommunity: CommunityLabelFor(communityID),
		BoundHost:         HostLabel(host),
		Actor:             ActorLabelFor(pubkeyHex),
	}
}

// ClaimedCommunityFromEvent returns the community an event claims: its first
// "h" tag's value parsed as a UUID, or nil if there is no such tag or the value
// is not a UUID. Later "h" tags are not consulted. It accepts [][]string as
// well as nostr.Tags. Use it on the write path only; reads never claim.
func ClaimedCommunityFromEvent[Tag ~[]string](tags []Tag) *CommunityLabel {
	for _, tag := range tags {
		if len(tag) == 0 || tag[0] != "h" {
			continue
		}
		if len(tag) < 2 {
			return nil
		}
		id, err := uuid.Parse(tag[1])
		if err != nil {
			return nil
		}
		label := CommunityLabelFor(id)
		return &label
	}
	return nil
}

// RecordReqAuthCheck records a REQ's channel authorization: allow when the
// actor is a member, deny otherwise. A REQ never claims a community.
func RecordReqAuthCheck(t Tracer, st AbstractState, channel uuid.UUID, member bool) {
	verdict := VerdictDeny
	if member {
		verdict = VerdictAllow
	}
	t.Record(NewStep(AuthCheck{Channel: ChannelLabelFor(channel), Verdict: verdict}, st))
}

// MissingLookup reports a row whose channel is absent from the
// channel→community lookup: a coverage breach, recorded as impl_bug.
type MissingLookup struct {
	Channel uuid.UUID
}

// Kind returns KindRowCommunityLookupMissing.
func (*MissingLookup) Kind() string { return KindRowCommunityLookupMissing }

func (e *MissingLookup) Error() string {
	return fmt.Sprintf("trace: %s: channel %s not in channel→community lookup", e.Kind(), e.Channel)
}

// ProjectRowCommunities returns the true community of each returned row, given
// each row's channel id (nil for a channel-less row). A channel-less row
// belongs to the resolved community; a channel-scoped row belongs to the
// community lookup reports for its channel. A channel missing from lookup
// yields a *MissingLookup error; the resolved community is never substituted.
func ProjectRowCommunities(rowChannels []*uuid.UUID, resolved uuid.UUID, lookup map[uuid.UUID]uuid.UUID) ([]CommunityLabel, error) {
	labels := make([]CommunityLabel, 0, len(rowChannels))
	for _, ch := range rowChannels {
		if ch == nil {
			labels = append(labels, CommunityLabelFor(resolved))
			continue
		}
		community, ok := lookup[*ch]
		if !ok {
			return nil, &MissingLookup{Channel: *ch}
		}
		labels = append(labels, CommunityLabelFor(community))
	}
	return labels, nil
}

// RecordReadMessageRows records read_message_rows for a non-search message
// read whose filter targeted channel (nil if none), or impl_bug on a lookup
// coverage breach. Callers build lookup only when Active(t, st).
func RecordReadMessageRows(t Tracer, st AbstractState, channel *uuid.UUID, rowChannels []*uuid.UUID, resolved uuid.UUID, lookup map[uuid.UUID]uuid.UUID) {
	// The only error is *MissingLookup.
	labels, err := ProjectRowCommunities(rowChannels, resolved, lookup)
	if err != nil {
		t.Record(NewStep(ImplBug{Kind: KindRowCommunityLookupMissing}, st))
		return
	}
	t.Record(NewStep(ReadMessageRows{Channel: channelLabelPtr(channel), RowCommunities: labels}, st))
}

// RecordReadByIDRows records read_by_id_rows for the search lane's hydration
// (whose filter channel is always nil), or impl_bug on a lookup coverage
// breach. Callers build lookup only when Active(t, st).
func RecordReadByIDRows(t Tracer, st AbstractState, rowChannels []*uuid.UUID, resolved uuid.UUID, lookup map[uuid.UUID]uuid.UUID) {
	// The only error is *MissingLookup.
	labels, err := ProjectRowCommunities(rowChannels, resolved, lookup)
	if err != nil {
		t.Record(NewStep(ImplBug{Kind: KindRowCommunityLookupMissing}, st))
		return
	}
	t.Record(NewStep(ReadByIDRows{RowCommunities: labels}, st))
}

func channelLabelPtr(ch *uuid.UUID) *ChannelLabel {
	if ch == nil {
		return nil
	}
	label := ChannelLabelFor(*ch)
	return &label
}

// SanitizedReasonFor maps a NIP-01 machine-readable rejection prefix to its
// sanitized reason. Either the bare prefix ("blocked") or a full message
// ("blocked: not a member") is accepted. "invalid" maps to invalid;
// "restricted", "auth-required" and "blocked" map to restricted; anything else
// maps to server_error.
func SanitizedReasonFor(prefix string) SanitizedReason {
	head, _, _ := strings.Cut(prefix, ":")
	switch strings.TrimSpace(head) {
	case "invalid":
		return ReasonInvalid
	case "restricted", "auth-required", "blocked":
		return ReasonRestricted
	default:
		return ReasonServerError
	}
}
