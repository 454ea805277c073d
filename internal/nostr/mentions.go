package nostr

// MentionedPubkey returns the pubkey a p tag names. The one rule for every
// reader of p tags (mention rows, listener delivery, p-gated reads): the
// value is 64 lowercase hex characters, as NIP-01 writes keys. Any other
// spelling names nobody; accepting upper case in one place only would let
// an event be delivered as a mention that "#p" reads and mention rows never
// show.
func MentionedPubkey(tag Tag) (string, bool) {
	if len(tag) < 2 || tag[0] != "p" || !IsHex64(tag[1]) {
		return "", false
	}
	return tag[1], true
}

// MentionedPubkeys returns the first max distinct pubkeys the p tags name
// (MentionedPubkey), first seen first; max <= 0 means all of them. Every
// consumer of mentions passes the same cap, so no pubkey is a mention for
// one (say, listener delivery) and not for another (mention rows).
func MentionedPubkeys(tags Tags, max int) []string {
	var out []string
	var seen map[string]struct{}
	for _, tag := range tags {
		pk, ok := MentionedPubkey(tag)
		if !ok {
			continue
		}
		if seen == nil {
			seen = map[string]struct{}{}
		}
		if _, dup := seen[pk]; !dup {
			seen[pk] = struct{}{}
			out = append(out, pk)
			if len(out) == max {
				break
			}
		}
	}
	return out
}
