package nostr

// Well-known kinds. See the NIPs for their meaning.
const (
	KindMetadata        = 0
	KindTextNote        = 1
	KindRecommendRelay  = 2
	KindContacts        = 3
	KindEncryptedDM     = 4
	KindDeletion        = 5
	KindRepost          = 6
	KindReaction        = 7
	KindGenericRepost   = 16
	KindZapRequest      = 9734
	KindZap             = 9735
	KindRelayList       = 10002
	KindAuth            = 22242
	KindHTTPAuth        = 27235
	KindLongFormContent = 30023

	// MaxKind is the largest kind NIP-01 allows.
	MaxKind = 65535
)

// IsReplaceable reports whether only the latest event per (pubkey, kind) is kept.
func IsReplaceable(kind int) bool {
	return kind == KindMetadata || kind == KindContacts || (kind >= 10000 && kind < 20000)
}

// IsEphemeral reports whether events of this kind are relayed but not stored.
func IsEphemeral(kind int) bool { return kind >= 20000 && kind < 30000 }

// IsAddressable reports whether only the latest event per (pubkey, kind, d tag) is kept.
func IsAddressable(kind int) bool { return kind >= 30000 && kind < 40000 }

// IsRegular reports whether every event of this kind is stored.
func IsRegular(kind int) bool {
	return kind >= 0 && kind <= MaxKind && !IsReplaceable(kind) && !IsEphemeral(kind) && !IsAddressable(kind)
}
