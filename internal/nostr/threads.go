package nostr

// ThreadRefs reads NIP-10 marked e tags: the thread root and the direct
// parent, each an event id in hex; when only one is marked it names both.
// Unmarked (positional) e tags are not read: the workflow trigger context
// and the agent runtime both follow only what a client marked.
func ThreadRefs(tags Tags) (root, parent string) {
	for _, tag := range tags {
		if len(tag) < 4 || tag[0] != "e" || !IsHex64(tag[1]) {
			continue
		}
		switch tag[3] {
		case "root":
			root = tag[1]
		case "reply":
			parent = tag[1]
		}
	}
	if root == "" {
		root = parent
	}
	if parent == "" {
		parent = root
	}
	return root, parent
}
