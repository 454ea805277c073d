package ingest

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// profileHandler mirrors kind 0 profiles into users. Malformed
// content is stored as sent (clients publish all sorts); the users row then
// records only which event it mirrors. Only channel_add_policy, which
// changes who may add the user to channels, is validated. An "agent_owner"
// field is content like any other: an agent's owner is recorded only from
// the owner's signed attestation (internal/nipoa), never from what the agent
// says about itself.
var profileHandler = Handler{Validate: validateProfile, Apply: applyProfile}

// profile is the part of a kind 0 content the relay reads.
type profile struct {
	fields           map[string]json.RawMessage // nil: content is not a JSON object
	channelAddPolicy *db.ChannelAddPolicy
}

func parseProfile(content string) (profile, error) {
	var p profile
	if json.Unmarshal([]byte(content), &p.fields) != nil {
		return profile{}, nil
	}
	if raw, ok := p.fields["channel_add_policy"]; ok {
		var s string
		policy := db.ChannelAddPolicy("")
		if json.Unmarshal(raw, &s) == nil {
			policy = db.ChannelAddPolicy(s)
		}
		if !policy.Valid() {
			return p, Reject("invalid", "channel_add_policy must be anyone, owner_only or nobody")
		}
		p.channelAddPolicy = &policy
	}
	return p, nil
}

// text returns the first of keys holding a non-empty string that PostgreSQL
// text can store, or nil.
func (p profile) text(keys ...string) *string {
	for _, k := range keys {
		var s string
		if raw, ok := p.fields[k]; ok && json.Unmarshal(raw, &s) == nil {
			if s = strings.TrimSpace(s); s != "" && !strings.ContainsRune(s, 0) {
				return &s
			}
		}
	}
	return nil
}

// ProfileDisplayName is the display name a kind 0 content gives its author
// in the users table ("display_name", else "name", trimmed), or "". A
// workflow message's @Name mentions are matched against it, so an agent
// checking who a doorbell may wake reads profiles the same way.
func ProfileDisplayName(content string) string {
	p, _ := parseProfile(content)
	if s := p.text("display_name", "name"); s != nil {
		return *s
	}
	return ""
}

func validateProfile(ev *nostr.Event) error {
	_, err := parseProfile(ev.Content)
	return err
}

func applyProfile(ctx context.Context, w *Write) error {
	p, _ := parseProfile(w.Event.Content)
	nip05 := p.text("nip05")
	if nip05 != nil && !nip05OnHost(*nip05, w.Tenant.Host()) {
		nip05 = nil // off-domain identifiers are not this community's to vouch for
	}
	id := w.Event.IDBytes()
	_, err := w.Q.UserProfileSync(ctx, db.UserProfileSyncParams{
		CommunityID:       w.Tenant.ID(),
		Pubkey:            w.ActorBytes(),
		DisplayName:       p.text("display_name", "name"),
		About:             p.text("about"),
		AvatarUrl:         p.text("picture"),
		Nip05Handle:       nip05,
		ChannelAddPolicy:  p.channelAddPolicy,
		MetadataEventID:   id[:],
		MetadataCreatedAt: time.Unix(w.Event.CreatedAt, 0),
		Now:               w.SQLNow(),
	})
	return err
}

// nip05OnHost reports whether a NIP-05 identifier ("name@domain", or a bare
// domain) names host, the community's own, port included. An identifier
// without a port names the domain's default port, which is another
// community when host has a port of its own: that one's members are not
// this community's to vouch for. Both sides get the one normalization
// communities' hosts get (case, a default port, a trailing dot, loopback).
func nip05OnHost(identifier, host string) bool {
	domain := identifier
	if at := strings.LastIndexByte(identifier, '@'); at >= 0 {
		domain = identifier[at+1:]
	}
	return domain != "" && community.NormalizeHost(domain) == host
}
