package nostr

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// ParseFilters applies exactly the REQ filter rules and limits.
func TestParseFilters(t *testing.T) {
	t.Parallel()
	lim := Limits{MaxFilters: 2}
	fs, err := ParseFilters([]byte(` [ {"kinds":[1],"#t":["x"]} , {"limit":3} ] `), lim)
	require.NoError(t, err)
	require.Len(t, fs, 2)
	require.Equal(t, []int{1}, fs[0].Kinds)
	require.Equal(t, []string{"x"}, fs[0].Tags["t"])
	require.Equal(t, 3, *fs[1].Limit)

	for input, want := range map[string]string{
		`{}`:                "filters must be a JSON array",
		`[]`:                "at least one filter is required",
		`[{},{},{}]`:        "too many filters (max 2)",
		`[{"kinds":["1"]}]`: "kinds must be integers",
		`[{"colour":1}]`:    "unknown filter field",
		`[{}] trailing`:     "",
		`[{} {}]`:           "",
		`[{"ids":["abc"]}]`: "ids must be 64-char lowercase hex",
	} {
		_, err := ParseFilters([]byte(input), lim)
		require.Error(t, err, input)
		require.Contains(t, err.Error(), want, input)
	}
}

// FuzzParseFilters: never panics, and whatever it accepts respects the
// limits and survives a marshal/parse round trip unchanged.
func FuzzParseFilters(f *testing.F) {
	for _, seed := range []string{`[{}]`, `[{"kinds":[0]},{"agent_owner":"` + hexA + `"}]`, `[{"agent_owner":null}]`, `[{"kinds":[1]},{"#e":["a"]}]`, `[`, `[{"limit":-1}]`, `[{},]`, `{"filters":[]}`} {
		f.Add([]byte(seed))
	}
	lim := Limits{MaxFilters: 3, MaxFilterValues: 50}
	f.Fuzz(func(t *testing.T, data []byte) {
		fs, err := ParseFilters(data, lim)
		if err != nil {
			return
		}
		require.NotEmpty(t, fs)
		require.LessOrEqual(t, len(fs), 3)
		out := []byte{'['}
		for i := range fs {
			if i > 0 {
				out = append(out, ',')
			}
			out = fs[i].AppendJSON(out)
		}
		out = append(out, ']')
		again, err := ParseFilters(out, lim)
		require.NoError(t, err, "%s", out)
		require.Equal(t, fs, again)
	})
}
