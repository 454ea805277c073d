package relay_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// One client address may hold at most half of the read slots, its
// WebSocket connections and its bridge requests together: while its reads
// are stuck in the database, a reader at another address is still served.
// Here address A sends three REQs and a bridge /query (four reads, as many
// as the relay's slots) whose page statements are held; only two run, and
// a search REQ from address B gets its EOSE. Once the statements go on,
// every read of A is answered too.
//
// Mutation killed: no share per address (A's four reads hold all four
// slots, and B's REQ is answered CLOSED "error: the relay is busy reading"
// after the query budget).
func TestOneAddressHoldsAtMostItsShareOfTheReadSlots(t *testing.T) {
	t.Parallel()
	held, r, _ := relayWithHeldStatement(t, eventstore.NameEventsPage, nil, func(c *config.Config) {
		c.TrustedProxies = mustPrefixes(t, "127.0.0.1")
		// A's held reads are answered, not timed out, on a loaded machine.
		c.QueryTimeout = 30 * time.Second
	})
	require.Equal(t, 2, eventstore.ClientShare(readSlots))
	from := func(addr string) http.Header { return http.Header{"X-Forwarded-For": {addr}} }

	release := held.start(t)
	var readers []*relaytest.Client
	for range 3 {
		c := r.DialWith(t, "", from("203.0.113.7"))
		c.Auth(nil)
		c.Send("REQ", "stuck", map[string]any{"kinds": []int{1}})
		readers = append(readers, c)
	}
	bridged := make(chan bridgeReply, 1)
	go func() {
		key := relaytest.NewKey(t)
		body := encodeBody(t, query(map[string]any{"kinds": []int{1}}))
		req, err := http.NewRequest(http.MethodPost, r.HTTPURL+"/query", bytes.NewReader(body))
		if err != nil {
			panic(err)
		}
		req.Header.Set("Authorization", authHeader(nip98(t, key, http.MethodPost, r.HTTPURL+"/query", body, nil)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Forwarded-For", "203.0.113.7")
		resp, err := bridgeHTTP.Do(req)
		if err != nil {
			bridged <- bridgeReply{Error: err.Error()}
			return
		}
		defer resp.Body.Close()
		reply := bridgeReply{Status: resp.StatusCode}
		if resp.StatusCode != http.StatusOK {
			_ = json.NewDecoder(resp.Body).Decode(&reply)
		}
		bridged <- reply
	}()
	require.Eventually(t, func() bool { return held.now.Load() >= 2 }, 30*time.Second, 10*time.Millisecond)
	// A relay without the share lets the other two reads into the database
	// within milliseconds.
	time.Sleep(time.Second)
	require.Equal(t, int32(2), held.now.Load(), "reads of one address running at once")

	other := r.DialWith(t, "", from("198.51.100.9"))
	other.Auth(nil)
	other.Send("REQ", "served", map[string]any{"search": "anything"})
	require.Equal(t, "EOSE", other.Expect("EOSE").Verb, "the other address's REQ")

	require.Equal(t, int32(2), held.most.Load(), "reads of one address running at once")

	// A's reads beyond its share waited for it, at most their wait, then
	// were answered busy; the rest are answered once the statements go on.
	release()
	for _, c := range readers {
		if reply := c.NextReply(); reply.Verb != "EOSE" {
			require.Equal(t, "CLOSED", reply.Verb)
			require.Equal(t, "error: the relay is busy reading; send the request again shortly", reply.Msg)
		}
	}
	select {
	case reply := <-bridged:
		if reply.Status != http.StatusOK {
			require.Equal(t, http.StatusServiceUnavailable, reply.Status, reply.Error)
			require.Equal(t, "error: the relay is busy reading; try again shortly", reply.Error)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the bridge /query was never answered")
	}
}

// A media request's reads count against its address's share too (every
// HTTP route does): while address A's share is held, A's upload waits for
// its statements' slots, and B's upload is stored meanwhile; A's is stored
// once its share is free.
//
// Mutation killed: media routes' reads carry no client address (A's upload
// takes slots of the shared pool and is stored while A's share is held).
func TestMediaRequestsCountAgainstTheirAddressShare(t *testing.T) {
	t.Parallel()
	fs := mediaStores["fs"](t)
	svc := media.NewService(fs, media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
	// 8 connections, 2 group writers: 4 read slots, a share of 2.
	r := relaytest.StartWith(t, dbtest.PoolOn(t, dbtest.URL(t), 8), []relay.Option{relay.WithMedia(svc)}, func(c *config.Config) {
		c.TrustedProxies = mustPrefixes(t, "127.0.0.1")
		c.IngestGroupWriters = 2
	})
	uploadFrom := func(addr string, blob []byte) <-chan mediaReply {
		done := make(chan mediaReply, 1)
		key := relaytest.NewKey(t)
		auth := blossomAuth(t, key, "upload", []string{hexSHA(blob)}, nil)
		go func() {
			done <- mediaDo(t, r, http.MethodPut, "", "/media/upload", auth, bytes.NewReader(blob), map[string]string{"X-Forwarded-For": addr})
		}()
		return done
	}
	release := r.Server.HoldReadShare("203.0.113.7")
	fromA := uploadFrom("203.0.113.7", pngBlob(t, 3000))
	fromB := <-uploadFrom("198.51.100.9", pngBlob(t, 3001))
	require.Equal(t, http.StatusOK, fromB.Status, "B's upload: %s", fromB.Body)
	select {
	case reply := <-fromA:
		t.Fatalf("A's upload was answered %d while its address's share was held", reply.Status)
	case <-time.After(time.Second):
	}
	release()
	select {
	case reply := <-fromA:
		require.Equal(t, http.StatusOK, reply.Status, "%s", reply.Body)
	case <-time.After(30 * time.Second):
		t.Fatal("A's upload was never answered")
	}
}
