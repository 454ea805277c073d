package relay

import (
	"fmt"
	"sync"
	"testing"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// A history's ids are found whether scanned (a few) or looked up in the set
// built past linearIDs, by deliveries asking at once; an event the history
// did not send, or JSON without an id first, is not.
//
// Mutation killed: the set built from the first linearIDs ids only (the
// later ones are not found).
func TestHistoryIDsFindsEverySentEvent(t *testing.T) {
	t.Parallel()
	raw := func(i int) []byte {
		return (&nostr.Event{ID: fmt.Sprintf("%064x", i), PubKey: fmt.Sprintf("%064x", 0), Tags: nostr.Tags{}}).AppendJSON(nil)
	}
	for _, n := range []int{3, linearIDs, linearIDs + 1, 10 * linearIDs} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			var ids []byte
			for i := 1; i <= n; i++ {
				ids = append(ids, nostr.RawEventID(raw(i))...)
			}
			h := &historyIDs{ids: &ids}
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					for i := 1; i <= n; i++ {
						if !h.contains(raw(i)) {
							t.Errorf("id %d of %d not found", i, n)
						}
					}
					if h.contains(raw(n+1)) || h.contains([]byte(`["EOSE","s"]`)) {
						t.Errorf("found what the history did not send (%d ids)", n)
					}
				})
			}
			wg.Wait()
		})
	}
}
