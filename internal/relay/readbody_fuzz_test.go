package relay

import (
	"encoding/json"
	"testing"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// FuzzParseReadBody: a /query or /count body is refused with an error or
// accepted as one JSON object whose only key is "filters", never a panic,
// whatever the bytes.
func FuzzParseReadBody(f *testing.F) {
	for _, seed := range []string{
		`{"filters":[{"kinds":[1]}]}`,
		`{"filters":[{}],"filters":[{}]}`,
		`{"Filters":[{}]}`,
		`{"filters":null}`,
		`{"filters":[]}`,
		`{"filters":[{}]} trailing`,
		`{"filters":[{"#t":["a"],"since":1,"limit":5}]}`,
		`[{}]`,
		`{`,
		``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		filters, err := parseReadBody(body, nostr.DefaultLimits())
		if err != nil {
			return
		}
		var object map[string]json.RawMessage
		if jerr := json.Unmarshal(body, &object); jerr != nil {
			t.Fatalf("accepted a body that is not a JSON object: %q (%v)", body, jerr)
		}
		if _, ok := object["filters"]; !ok || len(object) != 1 {
			t.Fatalf("accepted a body whose keys are not exactly filters: %q", body)
		}
		if len(filters) == 0 {
			t.Fatalf("accepted a body with no filter: %q", body)
		}
	})
}
