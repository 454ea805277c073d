package relay_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// Keys cost nothing and every upload writes objects: the quota bounds what
// they take, not only the blobs' bytes. Counted by bytes alone, uploads of
// one tiny blob under fresh keys each wrote another upload record and
// counted nothing, and tiny blobs counted a few bytes for three files of a
// block each: one community could fill the store's disk (or its inodes)
// within any quota. Deleting every upload gives all of it back. Mutations
// killed: records charged nothing (every upload of the shared blob is
// stored); blobs charged their bytes alone (15 tiny blobs stored, not 5);
// the sidecar charged nothing (15 uploads of the shared blob, not 14);
// a delete giving back nothing for the records it removes (56 KiB left
// counted).
func TestMediaQuotaCountsTheObjectsUploadsWrite(t *testing.T) {
	t.Parallel()
	const quota = 64 << 10
	const tries = 100
	svc := media.NewService(mediaStores["fs"](t), media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithMedia(svc)}, func(c *config.Config) { c.MediaCommunityQuotaBytes = quota })
	q := db.New(r.Pool)

	// One tiny blob, uploaded again and again under fresh keys.
	blob := pngBlob(t, 64)
	var uploaders []string
	stored := 0
	for range tries {
		key := relaytest.NewKey(t)
		rep := upload(t, r, "", key, blob)
		if rep.Status == http.StatusInsufficientStorage {
			break
		}
		require.Equal(t, http.StatusOK, rep.Status, "%s", rep.Body)
		uploaders = append(uploaders, blossomAuth(t, key, "delete", []string{hexSHA(blob)}, nil))
		stored++
	}
	require.Less(t, stored, tries, "uploads of one blob under fresh keys fill the quota")
	// The quota is 16 units of 4 KiB: the first upload counts three (the
	// 64 bytes in one, its sidecar, its record), each later one its record.
	require.Equal(t, 14, stored, "each upload after the first counts its record")
	require.LessOrEqual(t, mediaUsage(t, q, r.CommunityID), int64(quota))
	for _, auth := range uploaders {
		del := mediaDo(t, r, http.MethodDelete, "", "/media/"+hexSHA(blob), auth, nil, nil)
		require.Equal(t, http.StatusOK, del.Status, "%s", del.Body)
	}
	require.Zero(t, mediaUsage(t, q, r.CommunityID), "the deletes give everything back")

	// Tiny blobs, each new.
	key := relaytest.NewKey(t)
	stored = 0
	for range tries {
		rep := upload(t, r, "", key, pngBlob(t, 64))
		if rep.Status == http.StatusInsufficientStorage {
			break
		}
		require.Equal(t, http.StatusOK, rep.Status, "%s", rep.Body)
		stored++
	}
	require.Less(t, stored, tries, "tiny blobs fill the quota")
	require.Equal(t, 5, stored, "each blob counts its three objects (16 units / 3)")
}
