package relay

import (
	"encoding/json"
	"net/http"

	"github.com/buzzrelay/buzz/internal/community"
)

// relayInfo is the NIP-11 document. Limits are the ones this relay enforces.
type relayInfo struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Contact     string `json:"contact,omitempty"`
	// Self is the community's relay key: it signs the NIP-29 discovery
	// events (39000-39002) and membership notifications.
	Self          string     `json:"self,omitempty"`
	SupportedNIPs []int      `json:"supported_nips"`
	Software      string     `json:"software"`
	Version       string     `json:"version"`
	Limitation    limitation `json:"limitation"`
}

type limitation struct {
	MaxMessageLength    int   `json:"max_message_length"`
	MaxSubscriptions    int   `json:"max_subscriptions"`
	MaxFilters          int   `json:"max_filters"`
	MaxLimit            int   `json:"max_limit"`
	DefaultLimit        int   `json:"default_limit"`
	MaxSubIDLength      int   `json:"max_subid_length"`
	MaxEventTags        int   `json:"max_event_tags"`
	MaxContentLength    int   `json:"max_content_length"`
	AuthRequired        bool  `json:"auth_required"`
	RestrictedWrites    bool  `json:"restricted_writes"`
	CreatedAtUpperLimit int64 `json:"created_at_upper_limit"`
	// CreatedAtLowerLimit is the created_at floor, refused only for channel
	// events and only while a read replica is configured (docs/replica.md);
	// absent otherwise.
	CreatedAtLowerLimit int64 `json:"created_at_lower_limit,omitempty"`
	PaymentRequired     bool  `json:"payment_required"`
}

// infoCORS lets a web page on any origin read the document: NIP-11 asks
// for the three headers. No cookie or credential is involved, so any
// request header may come along (a page that adds one gets a preflight).
func infoCORS(h http.Header) {
	h.Set("Access-Control-Allow-Origin", "*")
	h.Set("Access-Control-Allow-Headers", "*")
	h.Set("Access-Control-Allow-Methods", "GET, OPTIONS")
}

// serveInfoPreflight answers a browser's CORS preflight for the document.
func serveInfoPreflight(w http.ResponseWriter, _ *http.Request, _ community.Tenant) {
	infoCORS(w.Header())
	w.Header().Set("Access-Control-Max-Age", "86400")
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) serveInfo(w http.ResponseWriter, r *http.Request, tenant community.Tenant) {
	infoCORS(w.Header())
	key, err := s.pipeline.RelayKey(r.Context(), tenant.ID())
	if err != nil {
		s.databaseFailed(w, r, err, "relay key")
		return
	}
	info := relayInfo{
		Self:        key.PublicKeyHex(),
		Name:        s.cfg.RelayName,
		Description: s.cfg.RelayDescription,
		Contact:     s.cfg.RelayContact,
		// 17 and 59: gift wraps are stored and reach only their recipient.
		SupportedNIPs: []int{1, 9, 10, 11, 17, 25, 29, 30, 40, 42, 45, 50, 59, 98},
		Software:      "https://github.com/buzzrelay/buzz",
		Version:       Version,
		Limitation: limitation{
			MaxMessageLength:    s.cfg.MaxMessageBytes,
			MaxSubscriptions:    s.cfg.MaxSubscriptions,
			MaxFilters:          s.cfg.MaxFilters,
			MaxLimit:            s.cfg.MaxLimit,
			DefaultLimit:        s.cfg.MaxLimit,
			MaxSubIDLength:      s.limits.MaxSubIDLength,
			MaxEventTags:        s.cfg.MaxEventTags,
			MaxContentLength:    s.cfg.MaxContentLength,
			AuthRequired:        true,
			RestrictedWrites:    true,
			CreatedAtUpperLimit: int64(s.cfg.MaxFutureSkew.Seconds()),
		},
	}
	if s.cfg.ReadDatabaseURL != "" {
		info.Limitation.CreatedAtLowerLimit = int64(s.cfg.CreatedAtFloor.Seconds())
	}
	w.Header().Set("Content-Type", "application/nostr+json")
	_ = json.NewEncoder(w).Encode(info)
}
