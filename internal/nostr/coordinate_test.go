package nostr

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseCoordinateAcceptsOnlyTheCanonicalSpelling(t *testing.T) {
	t.Parallel()
	pk := strings.Repeat("ab", 32)
	for _, v := range []string{
		"10002:" + pk + ":", "0:" + pk + ":", "3:" + pk + ":", "30023:" + pk + ":d", "30023:" + pk + ":",
		"30023:" + pk + ":a:b", "39999:" + pk + ":" + strings.Repeat("x", MaxCoordinateLen-len("39999:"+pk+":")),
	} {
		c, err := ParseCoordinate(v)
		require.NoError(t, err, v)
		require.Equal(t, v, c.String(), "round trip")
	}
	for _, v := range []string{
		"10002:" + pk, // no trailing colon
		"030023:" + pk + ":d", "+30023:" + pk + ":d", "-0:" + pk + ":", " 30023:" + pk + ":d", "30023 :" + pk + ":d",
		"30023:" + strings.ToUpper(pk) + ":d", "30023:" + pk[:62] + ":d", "30023::d", ":" + pk + ":",
		"10002:" + pk + ":x", // a replaceable kind has no d
		"1:" + pk + ":", "20001:" + pk + ":", "65536:" + pk + ":", "100000:" + pk + ":",
		"30023:" + pk + ":" + strings.Repeat("x", MaxCoordinateLen),
		"", "30023",
	} {
		_, err := ParseCoordinate(v)
		require.Error(t, err, v)
	}
}
