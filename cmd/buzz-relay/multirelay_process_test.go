package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// waitRedisConnected waits until the process reports in /ready that it is
// subscribed to the other processes' live traffic.
func (p *relayProcess) waitRedisConnected(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + p.addr + "/ready")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"redis":"connected"`)
	}, 60*time.Second, 20*time.Millisecond, "relay process %s never subscribed to Redis", p.name)
}

// Three `buzz-relay serve` processes on one database and one redis-server,
// as three pods behind a load balancer: a subscriber on A and one on C get
// what is published on B, once each and in order; B is SIGKILLed, and A and
// C keep serving each other with nothing stored lost. Presence announced on
// C is seen by a later subscriber on A.
// Mutations killed: serve not calling StartCrossRelay (BUZZ_REDIS_URL
// ignored: /ready never says connected, nothing crosses); presence kept in
// each process only (A's later subscriber sees nobody).
func TestThreeRelayProcessesServeAsOne(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	redisURL := dbtest.RedisURL(t)
	procs := make([]*relayProcess, 3)
	for i, name := range []string{"a", "b", "c"} {
		procs[i] = startRelayProcess(t, bin, name, map[string]string{
			"BUZZ_DATABASE_URL": withAppName(t, databaseURL, name),
			"BUZZ_REDIS_URL":    redisURL,
		})
	}
	for _, p := range procs {
		p.waitRedisConnected(t)
	}
	a, b, c := procs[0], procs[1], procs[2]

	publisher := b.client(t, nil)
	author := publisher.Key.PublicKeyHex()
	filter := map[string]any{"authors": []string{author}, "limit": 0}
	onA, onC := a.client(t, nil), c.client(t, nil)
	for _, sub := range []*relaytest.Client{onA, onC} {
		sub.Send("REQ", "live", filter)
		sub.Expect("EOSE")
	}
	const n = 20
	var want []string
	for i := range n {
		ev := publisher.Sign(1, fmt.Sprintf("note %d", i), nil, 0)
		require.True(t, publisher.Publish(ev).OK)
		want = append(want, ev.ID)
	}
	for name, sub := range map[string]*relaytest.Client{"A": onA, "C": onC} {
		var got []string
		for range want {
			got = append(got, sub.Expect("EVENT").Event.ID)
		}
		require.Equal(t, want, got, "subscriber on %s: each event of B once, in order", name)
	}

	// Presence announced on C is seen by a later subscriber on A.
	present := c.client(t, nil)
	channel := uuid.NewString()
	require.True(t, present.Publish(present.Sign(9007, "", nostr.Tags{{"h", channel}, {"name", "presence"}, {"visibility", "private"}}, 0)).OK)
	reader := a.client(t, nil)
	require.True(t, present.Publish(present.Sign(9000, "", nostr.Tags{{"h", channel}, {"p", reader.Key.PublicKeyHex()}}, 0)).OK)
	here := present.Sign(20001, "online", nostr.Tags{{"h", channel}}, 0)
	require.True(t, present.Publish(here).OK)
	got := reader.Req("present", map[string]any{"kinds": []int{20001}, "#h": []string{channel}})
	require.Len(t, got, 1, "presence set on C is seen on A")
	require.Equal(t, here.ID, got[0].ID)

	b.kill()
	fromC := c.client(t, publisher.Key)
	last := fromC.Sign(1, "after B died", nil, 0)
	require.True(t, fromC.Publish(last).OK)
	require.Equal(t, last.ID, onA.Expect("EVENT").Event.ID, "A and C keep serving each other")
	require.Equal(t, last.ID, onC.Expect("EVENT").Event.ID)
	stored := a.client(t, nil).Req("history", map[string]any{"authors": []string{author}})
	require.Len(t, stored, n+1, "nothing B stored is lost")
	onA.ExpectSilence(300*time.Millisecond, "no duplicate arrives on A")
}
