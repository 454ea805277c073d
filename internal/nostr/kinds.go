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
	KindGiftWrap        = 1059
	KindZapRequest      = 9734
	KindZap             = 9735
	KindRelayList       = 10002
	KindAuth            = 22242
	KindBlossomAuth     = 24242 // Blossom (BUD-01) HTTP authorization
	KindHTTPAuth        = 27235
	KindLongFormContent = 30023
	KindMemberAdded     = 44100 // relay-signed: a user was added to a channel
	KindMemberRemoved   = 44101 // relay-signed: a user was removed from a channel

	// MaxKind is the largest kind NIP-01 allows.
	MaxKind = 65535
)

// pGatedKinds is the one list of p-gated kinds: events stored and delivered
// only to their parties, the pubkeys their p tags name and their author,
// whoever else can read their channel: NIP-04 direct messages (whose tags
// and times would otherwise tell every reader who writes to whom), gift
// wraps (whose author is a throwaway key), and the relay's membership
// notifications (addressed to a user who may no longer read the channel).
// Ingest, the read scope of stored queries and live fan-out all use it.
var pGatedKinds = []int{KindEncryptedDM, KindGiftWrap, KindMemberAdded, KindMemberRemoved}

// PGatedKinds returns the p-gated kinds (a copy).
func PGatedKinds() []int { return append([]int(nil), pGatedKinds...) }

// IsPGated reports whether events of kind reach only their parties: the
// pubkeys they p-tag and their author.
func IsPGated(kind int) bool {
	for _, k := range pGatedKinds {
		if k == kind {
			return true
		}
	}
	return false
}

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
