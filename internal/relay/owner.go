package relay

import (
	"context"
	"encoding/hex"
	"time"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/nipoa"
)

// Results of recordOwner, also the labels of the owner attestation counter.
const (
	ownerRecorded = "recorded" // the attested owner is (now) the agent's owner
	ownerConflict = "conflict" // the agent already has a different owner
	ownerInvalid  = "invalid"  // the attestation did not verify (counted by callers)
	// ownerUnsigned: an x-auth-tag header the request's NIP-98 event does not
	// sign, for an agent with no owner on record: it records nothing.
	ownerUnsigned = "unsigned"
)

// ownerConflictNote accompanies a successful AUTH whose attestation names an
// owner other than the one on record.
const ownerConflictNote = "owner attestation not applied: this agent already has a different recorded owner, which is never replaced; this session has no owner"

// recordOwner records a verified attestation's owner as agent's owner in
// tenant, first wins. It returns the owner the session may rely on: the
// attested one when it is the one on record, "" when the agent already has
// a different owner (which is never replaced: a second owner's attestation
// gives the session no owner at all).
//
// mayRecord is whether the agent itself signed the attestation into its
// request (the AUTH event's own auth tag, or an x-auth-tag header its NIP-98
// event also carries). Without that, the attestation only confirms an owner
// already on record: the owner's signature names the agent but not the
// request, so whoever held one of the agent's NIP-98 headers unused (a
// proxy, a log) could otherwise send it first with an attestation of their
// own and become the agent's owner for good.
func (s *Server) recordOwner(ctx context.Context, tenant community.Tenant, agent string, a *nipoa.Attestation, mayRecord bool) (string, error) {
	agentKey, err := hex.DecodeString(agent)
	if err != nil {
		return "", err
	}
	// Any key may AUTH with an attestation from any other key, so both
	// statements below wait for a read slot (errReadSlotsBusy past the
	// wait): a flood of fresh agents never takes the writers' connections.
	release, err := s.readSlot(ctx)
	if err != nil {
		return "", err
	}
	defer release()
	// Most attestations repeat the owner already on record (an agent sends
	// its tag on every connection and request): a read settles those
	// without writing the row. The write below is the authority on a race.
	current, err := s.queries.UserChannelAddPolicy(ctx, db.UserChannelAddPolicyParams{CommunityID: tenant.ID(), Pubkey: agentKey, Now: s.clock.SQL()})
	if err != nil && !dberr.IsNotFound(err) {
		return "", err
	}
	recorded := current.AgentOwnerPubkey // nil too once its attestation ended
	until := attestationEnd(a)
	// The owner's attestation with another end (renewed, say) moves the
	// record's end, when the agent itself sent it.
	renewed := recorded != nil && mayRecord && hex.EncodeToString(recorded) == a.Owner && !sameEnd(current.AgentOwnerUntil, until)
	if recorded == nil && !mayRecord {
		s.metrics.OwnerAttestations.WithLabelValues(ownerUnsigned).Inc()
		s.log.Info("x-auth-tag header not signed by the request; no owner recorded",
			"community", tenant.Host(), "agent", agent, "attested", a.Owner)
		return "", nil
	}
	if recorded == nil || renewed {
		ownerKey, _ := hex.DecodeString(a.Owner)
		if recorded, err = s.queries.UserAgentOwnerRecord(ctx, db.UserAgentOwnerRecordParams{
			CommunityID: tenant.ID(), Owner: ownerKey, Agent: agentKey, Until: until, Now: s.clock.SQL(),
		}); err != nil {
			return "", err
		}
	}
	if hex.EncodeToString(recorded) != a.Owner {
		s.metrics.OwnerAttestations.WithLabelValues(ownerConflict).Inc()
		s.log.Warn("owner attestation conflicts with the recorded owner; session has no owner",
			"community", tenant.Host(), "agent", agent, "attested", a.Owner, "recorded", hex.EncodeToString(recorded))
		return "", nil
	}
	s.metrics.OwnerAttestations.WithLabelValues(ownerRecorded).Inc()
	return a.Owner, nil
}

// attestationEnd is when a's owner stops counting as the agent's owner:
// its created_at< bound, nil for none.
func attestationEnd(a *nipoa.Attestation) *time.Time {
	until, bounded := a.Until()
	if !bounded {
		return nil
	}
	end := time.Unix(until, 0)
	return &end
}

// sameEnd reports whether two attestation ends are equal (nil: none).
func sameEnd(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}
