package relay_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// An AUTH's signature costs the relay tens of microseconds to verify and
// the client nothing to ask for again: it may send one message, with a
// signature that does not verify, over and over. A connection gets ten
// checks at once and one a second after that; past them, its AUTHs
// are refused unverified with rate-limited, and the connection stays.
// AUTHs that fail the checks that cost nothing (the challenge) spend
// nothing, and a connection's flood takes nothing from another connection
// of the same address: a new one authenticates at once. The clock stands
// still, so nothing refills during the flood.
// Mutations killed: no bound (all 200 verified); the signature verified
// before the challenge (the first connection's wrong-challenge AUTHs spend
// its checks: 30 verified, not 40); one bucket for the address (10).
func TestAuthVerificationsPerConnectionAreBounded(t *testing.T) {
	t.Parallel()
	const connections, checksAtOnce = 4, 10
	clk := &stoppedClock{now: time.Now()}
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithClock(clock.Stub(clk.at))}, func(c *config.Config) {
		c.TrustedProxies = mustPrefixes(t, "127.0.0.1")
	})
	from := func(addr string) http.Header { return http.Header{"X-Forwarded-For": {addr}} }

	// Wrong challenges cost nothing and take nothing.
	first := r.DialWith(t, "", from("203.0.113.1"))
	for range 20 {
		key := relaytest.NewKey(t)
		ev := first.AuthEvent(key)
		ev.Tags[1][1] = "not-the-challenge"
		require.NoError(t, ev.Sign(key))
		first.Send("AUTH", ev)
		require.Contains(t, first.Expect("OK").Msg, "invalid: AUTH challenge does not match")
	}

	// Connections from one address flood AUTHs with a bad signature, all
	// at once.
	const each = 50
	var wg sync.WaitGroup
	var verifiedMu sync.Mutex
	verified, refused := 0, 0
	var flooders []*relaytest.Client
	for range connections {
		c := first
		if c == nil {
			c = r.DialWith(t, "", from("203.0.113.1"))
		}
		first = nil
		flooders = append(flooders, c)
		ev := c.AuthEvent(relaytest.NewKey(t))
		ev.Sig = tamperedSig(ev.Sig)
		frame, err := json.Marshal([]any{"AUTH", ev})
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				c.SendRaw(string(frame))
			}
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				msg := c.Expect("OK").Msg
				verifiedMu.Lock()
				switch {
				case strings.HasPrefix(msg, "invalid: AUTH event: "):
					verified++
				case strings.HasPrefix(msg, "rate-limited: too many AUTH attempts on this connection; try again in "):
					refused++
				default:
					t.Errorf("unexpected answer %q", msg)
				}
				verifiedMu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Equal(t, connections*checksAtOnce, verified, "signatures verified")
	require.Equal(t, connections*each-connections*checksAtOnce, refused)

	// A new connection from the same address authenticates at once.
	r.DialWith(t, "", from("203.0.113.1")).Auth(nil)

	// A second later a flooding connection may authenticate again: the
	// refusals left it open.
	c := flooders[0]
	ev := c.AuthEvent(relaytest.NewKey(t))
	c.Send("AUTH", ev)
	require.Contains(t, c.Expect("OK").Msg, "rate-limited: ")
	clk.advance(time.Second)
	c.Auth(nil)
	require.True(t, c.Publish(c.Sign(1, "after the flood", nil, 0)).OK)
}

// tamperedSig is sig with its last hex digit changed, so it never
// verifies: setting the last byte to 00 left one signature in 256 valid,
// and that connection's AUTHs were accepted (a flaky count).
func tamperedSig(sig string) string {
	last := byte('0')
	if sig[len(sig)-1] == '0' {
		last = '1'
	}
	return sig[:len(sig)-1] + string(last)
}
