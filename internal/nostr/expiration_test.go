package nostr

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestExpirationIsDigitsOnly: an expiration is read as created_at is
// written, decimal digits without sign, spaces or leading zeros; any other
// spelling is refused, not read as the number strconv would make of it.
func TestExpirationIsDigitsOnly(t *testing.T) {
	for value, want := range map[string]int64{"0": 0, "9999999999": 9999999999, "9223372036854775807": 1<<63 - 1} {
		at, ok, err := (&Event{Tags: Tags{{"expiration", value}}}).Expiration()
		require.NoError(t, err, value)
		require.True(t, ok, value)
		require.Equal(t, want, at, value)
	}
	for _, value := range []string{"", "+9999999999", "-0", "-1", "09999999999", "00", " 9999999999", "9999999999 ", "9_999", "1e9", "1.0", "0x10", "٣", "9223372036854775808"} {
		_, ok, err := (&Event{Tags: Tags{{"expiration", value}}}).Expiration()
		require.ErrorIs(t, err, errExpiration, "%q", value)
		require.False(t, ok, "%q", value)
	}
	_, ok, err := (&Event{Tags: Tags{{"expiration"}}}).Expiration()
	require.NoError(t, err, "a tag without a value is no expiration")
	require.False(t, ok)
}

// FuzzExpiration: an expiration accepted is the canonical decimal of the
// time it is read as, so no two spellings name one time.
func FuzzExpiration(f *testing.F) {
	for _, s := range []string{"0", "1700000000", "+1700000000", "-0", "01", " 1", "1 ", "9223372036854775807", "9223372036854775808"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		at, ok, err := (&Event{Tags: Tags{{"expiration", s}}}).Expiration()
		if err != nil {
			require.False(t, ok)
			// Refused only if it is not the one spelling of a time.
			if n, perr := strconv.ParseInt(s, 10, 64); perr == nil && n >= 0 {
				require.NotEqual(t, s, strconv.FormatInt(n, 10), "the canonical spelling of %d was refused", n)
			}
			return
		}
		require.True(t, ok)
		require.Equal(t, s, strconv.FormatInt(at, 10))
	})
}
