package relay

import (
	"encoding/hex"
	"net/http"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// recordedOwnerWire answers GET /v1/users/{pubkey}/recorded-owner.
type recordedOwnerWire struct {
	Pubkey           string  `json:"pubkey"`
	AgentOwnerPubkey string  `json:"agent_owner_pubkey"`
	OwnerDisplayName *string `json:"owner_display_name"`
	ChannelAddPolicy string  `json:"channel_add_policy"`
}

// serveRecordedOwner tells an authenticated caller (NIP-98) which owner the
// relay recorded for an agent in this community, and that owner's display
// name here. Clients show it beside profiles so two agents with the same
// name can be told apart; 404 when no owner is recorded.
func (b *httpBridge) serveRecordedOwner(w http.ResponseWriter, r *http.Request, tenant community.Tenant) {
	s := b.s
	if _, _, ok := b.authenticate(w, r, tenant); !ok {
		return
	}
	pubkey := r.PathValue("pubkey")
	key, ok := nostr.DecodeHex32(pubkey)
	if !ok {
		writeError(w, http.StatusBadRequest, "invalid: pubkey must be 64-char lowercase hex")
		return
	}
	release, err := s.readSlot(r.Context())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, busyReadingReason)
		return
	}
	row, err := s.queries.UserRecordedOwner(r.Context(), db.UserRecordedOwnerParams{CommunityID: tenant.ID(), Pubkey: key[:], Now: s.clock.SQL()})
	release()
	if dberr.IsNotFound(err) {
		writeError(w, http.StatusNotFound, "invalid: no recorded owner for "+pubkey)
		return
	}
	if err != nil {
		s.databaseFailed(w, r, err, "recorded owner lookup")
		return
	}
	writeJSON(w, http.StatusOK, recordedOwnerWire{
		Pubkey:           pubkey,
		AgentOwnerPubkey: hex.EncodeToString(row.AgentOwnerPubkey),
		OwnerDisplayName: row.OwnerDisplayName,
		ChannelAddPolicy: string(row.ChannelAddPolicy),
	})
}
