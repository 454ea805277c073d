package nostr

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMentionedPubkeysTakesLowercaseHexOnly(t *testing.T) {
	t.Parallel()
	a, b := strings.Repeat("ab", 32), strings.Repeat("01", 32)
	tags := Tags{
		{"p", a}, {"p", strings.ToUpper(b)}, {"p", "Ab" + a[2:]}, {"p", b}, {"p", a}, {"p"}, {"e", b}, {"p", a[:62]}, {"p", b, "wss://r", "x"},
	}
	require.Equal(t, []string{a, b}, MentionedPubkeys(tags, 0))
	require.Equal(t, []string{a}, MentionedPubkeys(tags, 1))
	require.Equal(t, []string{a, b}, MentionedPubkeys(tags, 5))
	_, ok := MentionedPubkey(Tag{"p", strings.ToUpper(a)})
	require.False(t, ok)
}
