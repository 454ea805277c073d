package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/semaphore"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// readSlots is the number of read slots of a relay from
// relayWithHeldStatement (an 8-connection pool, 2 group writers).
const readSlots = 4

// holdReadSlots takes n of slots until the returned func gives them back
// (also at the end of the test).
func holdReadSlots(t *testing.T, slots *semaphore.Weighted, n int64) (release func()) {
	t.Helper()
	// Waits: the relay's own background reads may hold a slot for a moment
	// after it starts.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, slots.Acquire(ctx, n), "the read slots never came free")
	released := false
	release = func() {
		if !released {
			released = true
			slots.Release(n)
		}
	}
	t.Cleanup(release)
	return release
}

// An AUTH whose owner attestation finds every read slot taken for the whole
// wait is refused as busy, not as a failure to record, and the connection
// stays: the same AUTH sent again once a slot is free authenticates and
// records the owner. Mutation killed: the busy case left to the generic
// answer ("error: could not record the owner attestation; try again").
func TestAuthAttestationPastTheReadSlotWaitIsBusy(t *testing.T) {
	t.Parallel()
	_, r, _ := relayWithHeldStatement(t, "none", nil)
	c := r.Dial(t, "")
	agent, owner := relaytest.NewKey(t), relaytest.NewKey(t)
	auth := c.AuthEvent(agent)
	auth.Tags = append(auth.Tags, attest(t, owner, agent.PublicKeyHex(), ""))
	require.NoError(t, auth.Sign(agent))

	release := holdReadSlots(t, r.Server.ReadSlots(), readSlots)
	c.Send("AUTH", auth)
	busy := c.Expect("OK")
	require.False(t, busy.OK)
	require.Equal(t, "error: the relay is busy; send the AUTH again shortly", busy.Msg)
	require.Empty(t, recordedOwner(t, r, agent.PublicKeyHex()))

	release()
	c.Send("AUTH", auth)
	ok := c.Expect("OK")
	require.True(t, ok.OK, ok.Msg)
	require.Equal(t, owner.PublicKeyHex(), recordedOwner(t, r, agent.PublicKeyHex()))
	c.Key = agent
	require.True(t, c.Publish(c.Sign(1, "after the busy AUTH", nil, 0)).OK, "the connection survived")
}

// An HTTP request whose x-auth-tag attestation finds every read slot taken
// for the whole wait (its Host lookup and its auth claim found one free) is
// answered 503 JSON, recording nothing, and gives its auth event's claim
// back: the same request sent again, with the same header, is served and
// records the owner; sent once more, it is a replay (401). The slots are taken between the claim and the attestation:
// the claim's statement is held while the test takes two slots and queues
// for the last two, so the claim's slot goes to the test, not to the
// attestation. Mutations killed: the busy case left to the generic 500
// ("could not record the owner attestation; try again"); the claim kept
// (the same header is refused 401); the claim released whatever the
// outcome (the replay of the served request is served again).
func TestXAuthTagPastTheReadSlotWaitIsBusy(t *testing.T) {
	t.Parallel()
	held, r, _ := relayWithHeldStatement(t, "HTTPAuthReplayClaim", nil)
	agent, owner := relaytest.NewKey(t), relaytest.NewKey(t)
	tag := attest(t, owner, agent.PublicKeyHex(), "")
	body := encodeBody(t, query(map[string]any{"kinds": []int{1}}))
	ev := nip98(t, agent, http.MethodPost, r.HTTPURL+"/query", body, func(ev *nostr.Event) { ev.Tags = append(ev.Tags, tag) })
	send := func() (int, map[string]any) {
		return sendWithTag(t, r, http.MethodPost, "/query", authHeader(ev), tagJSON(t, tag), body)
	}

	releaseClaim := held.start(t)
	type answer struct {
		status int
		out    map[string]any
	}
	answers := make(chan answer, 1)
	go func() {
		status, out := send()
		answers <- answer{status, out}
	}()
	<-held.entered // the claim holds one slot
	slots := r.Server.ReadSlots()
	releaseTwo := holdReadSlots(t, slots, 2)
	queued := make(chan struct{})
	go func() {
		defer close(queued)
		_ = slots.Acquire(context.Background(), 2) // background: never fails
	}()
	// One slot is free: a TryAcquire fails only once a waiter is queued.
	waitFor(t, func() bool {
		if slots.TryAcquire(1) {
			slots.Release(1)
			return false
		}
		return true
	})
	releaseClaim()
	<-queued // every slot is the test's

	busy := <-answers
	require.Equal(t, http.StatusServiceUnavailable, busy.status, busy.out)
	require.Equal(t, "error: the relay is busy reading; try again shortly", busy.out["error"])
	require.Empty(t, recordedOwner(t, r, agent.PublicKeyHex()))

	releaseTwo()
	slots.Release(2)
	status, out := send()
	require.Equal(t, http.StatusOK, status, out)
	require.Equal(t, owner.PublicKeyHex(), recordedOwner(t, r, agent.PublicKeyHex()))
	status, out = send()
	require.Equal(t, http.StatusUnauthorized, status, out)
	require.Equal(t, "auth-required: "+authEventUsed, out["error"])
}

// An upload whose quota reservation finds every read slot taken for the
// whole wait (its Host lookup and serving-write lease found one free) is
// answered 503 JSON with X-Reason, stores and counts nothing and holds no
// lease or blob lock afterwards, and the same upload sent again on the
// same client once a slot is free is stored. Mutation killed: the busy
// case left to the generic answer (500 "error: could not reach the media
// store; try again").
func TestMediaUploadPastTheReadSlotWaitIsBusy(t *testing.T) {
	t.Parallel()
	store, err := media.NewFSStore(t.TempDir())
	require.NoError(t, err)
	svc := media.NewService(store, media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
	_, r, _ := relayWithHeldStatement(t, "none", []relay.Option{relay.WithMedia(svc)})
	blob := pngBlob(t, 4096)
	auth := blossomAuth(t, relaytest.NewKey(t), "upload", []string{hexSHA(blob)}, nil)

	pipe, feed := io.Pipe()
	replies := make(chan mediaReply, 1)
	go func() { replies <- mediaDo(t, r, http.MethodPut, "", "/media/upload", auth, pipe, nil) }()
	_, err = feed.Write(blob[:100])
	require.NoError(t, err)
	waitFor(t, func() bool {
		var live int
		return r.Pool.QueryRow(context.Background(), `SELECT count(*) FROM community_serving_write_leases`).Scan(&live) == nil && live == 1
	})
	release := holdReadSlots(t, r.Server.ReadSlots(), readSlots)
	_, err = feed.Write(blob[100:])
	require.NoError(t, err)
	require.NoError(t, feed.Close())

	busy := <-replies
	require.Equal(t, http.StatusServiceUnavailable, busy.Status, "%s", busy.Body)
	require.Equal(t, "error: the relay is busy reading; try again shortly", busy.Error)
	require.Equal(t, busy.Error, busy.Header.Get("X-Reason"))
	release()
	requireNothingLeft(t, r, store, blob)

	again := mediaDo(t, r, http.MethodPut, "", "/media/upload", auth, bytes.NewReader(blob), nil)
	require.Equal(t, http.StatusOK, again.Status, "%s", again.Body)
	require.Equal(t, uploadCharge(blob), mediaUsage(t, db.New(r.Pool), r.CommunityID))
}

// Every busy answer over HTTP starts with a NIP-01 prefix, as every other
// refusal a client sees does. Every HTTP request, a WebSocket upgrade and
// a bridge query alike, looks its Host up first, under a read slot: with
// every slot taken for the whole wait both are answered 503
// "error: the relay is busy reading; try again shortly" (they said "relay
// busy reading; retry shortly", which a client reading the prefix could
// not tell from an unknown failure). The bridge's NIP-98 claim answers the
// same (TestXAuthTagPastTheReadSlotWaitIsBusy).
// Mutation killed: the Host lookup's busy answer without its prefix.
func TestHTTPBusyAnswersCarryANIP01Prefix(t *testing.T) {
	t.Parallel()
	_, r, _ := relayWithHeldStatement(t, "none", nil)
	body := encodeBody(t, query(map[string]any{"kinds": []int{1}}))
	other := "busy-lookup.example" // its own lookup, run beside the home host's
	r.AddCommunity(t, other)
	upgrade := func() bridgeReply {
		req, err := http.NewRequest(http.MethodGet, r.HTTPURL+"/", nil)
		require.NoError(t, err)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		resp, err := bridgeHTTP.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		out := bridgeReply{Status: resp.StatusCode, Raw: string(raw)}
		require.NoError(t, json.Unmarshal(raw, &out), "%s", raw)
		return out
	}
	requests := map[string]func() bridgeReply{
		"query":   func() bridgeReply { return send(t, r, other, "/query", "", body) },
		"upgrade": upgrade,
	}
	release := holdReadSlots(t, r.Server.ReadSlots(), readSlots)
	replies := make(map[string]chan bridgeReply, len(requests))
	for name := range requests {
		replies[name] = make(chan bridgeReply, 1)
	}
	for name, do := range requests {
		reply := replies[name]
		go func() { reply <- do() }()
	}
	for name, reply := range replies {
		got := <-reply
		require.Equal(t, http.StatusServiceUnavailable, got.Status, "%s: %s", name, got.Raw)
		require.Equal(t, "error: the relay is busy reading; try again shortly", got.Error, name)
	}
	release()
	require.Equal(t, http.StatusUnauthorized, send(t, r, "", "/query", "", body).Status, "served once a slot is free")
}
