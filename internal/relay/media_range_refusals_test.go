package relay_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/relaytest"
)

// The refusals http.ServeContent makes itself (a range past the end or
// otherwise unsatisfiable, 416; a failed If-Match, 412) are media
// refusals like the others: JSON with a prefixed reason, in X-Reason too.
// A suffix range of zero bytes is unsatisfiable: ServeContent answered it
// 206 with "Content-Range: bytes 62-61/62", which names no byte. Mutation
// killed: the writer that rewrites ServeContent's refusals removed (416 and
// 412 answered as text/plain, the zero suffix 206).
func TestMediaReadRefusalsAreJSON(t *testing.T) {
	t.Parallel()
	r := mediaRelay(t, mediaStores["fs"](t))
	blob := pngBlob(t, 62)
	require.Equal(t, http.StatusOK, upload(t, r, "", relaytest.NewKey(t), blob).Status)
	path := "/media/" + hexSHA(blob)

	for _, tc := range []struct {
		name, header, value string
		status              int
		reason              string
	}{
		{"past the end", "Range", "bytes=1000-", http.StatusRequestedRangeNotSatisfiable, "invalid: the range is not satisfiable: the blob is 62 bytes"},
		{"backwards", "Range", "bytes=5-2", http.StatusRequestedRangeNotSatisfiable, "invalid: the range is not satisfiable: the blob is 62 bytes"},
		{"huge", "Range", "bytes=99999999999999999999-", http.StatusRequestedRangeNotSatisfiable, "invalid: the range is not satisfiable: the blob is 62 bytes"},
		{"zero suffix", "Range", "bytes=-0", http.StatusRequestedRangeNotSatisfiable, "invalid: the range is not satisfiable: the blob is 62 bytes"},
		{"other version", "If-Match", `"0000"`, http.StatusPreconditionFailed, `invalid: precondition failed: the blob's ETag is "` + hexSHA(blob) + `"`},
	} {
		for _, method := range []string{http.MethodGet, http.MethodHead} {
			got := mediaDo(t, r, method, "", path, "", nil, map[string]string{tc.header: tc.value})
			require.Equal(t, tc.status, got.Status, "%s %s: %s", method, tc.name, got.Body)
			require.Equal(t, tc.reason, got.Header.Get("X-Reason"), "%s %s", method, tc.name)
			require.Equal(t, "application/json", got.Header.Get("Content-Type"), "%s %s", method, tc.name)
			require.Equal(t, "no-store", got.Header.Get("Cache-Control"), "%s %s: a shared cache must not keep a refusal", method, tc.name)
			require.Empty(t, got.Header.Get("ETag"), "%s %s", method, tc.name)
			if method == http.MethodGet {
				require.Equal(t, tc.reason, got.Error, "%s", tc.name)
			}
			if tc.status == http.StatusRequestedRangeNotSatisfiable {
				require.Equal(t, "bytes */62", got.Header.Get("Content-Range"), "%s %s", method, tc.name)
			}
		}
	}
	// What is satisfiable still is.
	got := mediaDo(t, r, http.MethodGet, "", path, "", nil, map[string]string{"Range": "bytes=-5"})
	require.Equal(t, http.StatusPartialContent, got.Status)
	require.Equal(t, "bytes 57-61/62", got.Header.Get("Content-Range"))
	require.Equal(t, blob[57:], got.Body)
}
