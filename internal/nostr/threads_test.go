package nostr

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestThreadRefs(t *testing.T) {
	t.Parallel()
	a, b := strings.Repeat("a", 64), strings.Repeat("b", 64)
	for name, tc := range map[string]struct {
		tags         Tags
		root, parent string
	}{
		"root and reply":     {Tags{{"e", a, "", "root"}, {"e", b, "", "reply"}}, a, b},
		"root alone":         {Tags{{"e", a, "", "root"}}, a, a},
		"reply alone":        {Tags{{"e", b, "", "reply"}}, b, b},
		"positional ignored": {Tags{{"e", a}, {"e", b, ""}}, "", ""},
		"not an id":          {Tags{{"e", "xyz", "", "root"}}, "", ""},
		"mention marker":     {Tags{{"e", a, "", "mention"}}, "", ""},
	} {
		root, parent := ThreadRefs(tc.tags)
		require.Equal(t, tc.root, root, name)
		require.Equal(t, tc.parent, parent, name)
	}
}
