package relay_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/media/mediatest"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A delete that removes its community's last reference to a blob answers
// once the community's upload record and sidecar are gone; whether the
// blob goes too (no other community references it) is settled after the
// answer. Waited for, the answer came measurably later when nobody else
// held the bytes (the check of every community and the blob's removal)
// than when another community did: it told the deleter whether someone
// elsewhere on the relay stored them. Here the blob's removal is held in
// the store: the delete answers 200 all the same with the community's
// record and sidecar gone, and once the removal is let go the store is
// empty.
// Mutation killed: the removal made inside Delete again (the answer waits
// for the held removal).
func TestMediaDeleteAnswersBeforeTheBlobIsRemoved(t *testing.T) {
	t.Parallel()
	store := mediatest.NewHoldDelete(mediaStores["fs"](t), 1)
	r, svc := mediaRelayService(t, store)
	released := false
	release := func() {
		if !released {
			released = true
			close(store.Release)
		}
	}
	t.Cleanup(release) // before the relay's Shutdown, which waits for the removal
	alice := relaytest.NewKey(t)
	blob := pngBlob(t, 3000)
	sha := hexSHA(blob)
	require.Equal(t, http.StatusOK, upload(t, r, "", alice, blob).Status)

	req, err := http.NewRequest(http.MethodDelete, r.HTTPURL+"/media/"+sha, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", blossomAuth(t, alice, "delete", []string{sha}, nil))
	type answer struct {
		status int
		err    error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- answer{err: err}
			return
		}
		resp.Body.Close()
		answered <- answer{status: resp.StatusCode}
	}()
	<-store.Entered
	var del answer
	select {
	case del = <-answered:
	case <-time.After(relaytest.Patience): // a hang guard, not a measure
		release()
		<-answered
		t.Fatal("the delete's answer waited for the blob's removal")
	}
	require.NoError(t, del.err)
	require.Equal(t, http.StatusOK, del.status)
	// Read from the store itself: the held removal keeps the test relay's
	// only read slot (the blob lock's), which a GET's host lookup awaits.
	require.Equal(t, []string{sha + ".png"}, storeKeys(t, store), "only the blob, whose removal is held, is left")

	release()
	require.NoError(t, svc.WaitForRemovals(context.Background()))
	require.Empty(t, storeKeys(t, store))
	require.Equal(t, http.StatusNotFound, mediaDo(t, r, http.MethodGet, "", "/media/"+sha, "", nil, nil).Status)
}

// A blob removal still running when the relay's Shutdown runs out of time
// is abandoned: Shutdown says its time ran out, the removal's context
// ends (the held store call gives up), and the blob stays in the store,
// unreferenced: space only.
// Mutation killed: Shutdown not waiting for the removals (the removal runs
// on until its own 30 s timeout: its context ends with deadline exceeded).
func TestMediaBlobRemovalAbandonedAtShutdown(t *testing.T) {
	t.Parallel()
	store := mediatest.NewHoldDelete(mediaStores["fs"](t), 1)
	r, svc := mediaRelayService(t, store)
	alice := relaytest.NewKey(t)
	blob := pngBlob(t, 3000)
	sha := hexSHA(blob)
	require.Equal(t, http.StatusOK, upload(t, r, "", alice, blob).Status)
	del := mediaDo(t, r, http.MethodDelete, "", "/media/"+sha, blossomAuth(t, alice, "delete", []string{sha}, nil), nil, nil)
	require.Equal(t, http.StatusOK, del.Status, "%s", del.Body)
	<-store.Entered

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, r.Shutdown(ctx), context.Canceled)
	require.ErrorIs(t, <-store.GaveUp, context.Canceled, "the removal's context ended with Shutdown, not by its own timeout")
	require.NoError(t, svc.WaitForRemovals(context.Background()))
	require.Equal(t, []string{sha + ".png"}, storeKeys(t, store), "the abandoned removal's blob stays")
}
