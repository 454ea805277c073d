package relay_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A connection's pings are answered ten at once, then one a second: past
// them the relay stops reading the connection until the bucket refills, so
// the pings wait in the socket unanswered, while another connection is
// answered as before. The clock stands still, so the bucket refills only
// when the test moves it.
// Mutation killed: no OnPingReceived hook (all 50 pings answered at once,
// no wait counted).
func TestPingsPerConnectionArePaced(t *testing.T) {
	t.Parallel()
	clk := &stoppedClock{now: time.Now()}
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithClock(clock.Stub(clk.at))}, func(c *config.Config) {
		c.AuthTimeout = time.Hour
	})
	flooder := dialRaw(t, r)
	const sent = 50
	var pings []byte
	for i := range sent {
		pings = append(pings, maskedFrame(0x9, []byte{byte(i)})...)
	}
	_, err := flooder.conn.Write(pings)
	require.NoError(t, err)
	waitMetric(t, r, "buzz_pings_paced_total", "1")
	require.Equal(t, []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, flooder.pongs(t, 500*time.Millisecond), "ten pongs at once, then none while the clock stands still")

	other := r.Dial(t, "")
	other.Send("CLOSE", "x")
	require.Contains(t, other.Expect("NOTICE").Msg, "auth-required: ", "another connection is read as before")

	clk.advance(time.Second)
	waitMetric(t, r, "buzz_pings_paced_total", "2")
	require.Equal(t, []byte{10}, flooder.pongs(t, 500*time.Millisecond), "one more pong a second")
}

// frameConn is a WebSocket connection written and read frame by frame, so
// a test can send control frames the library's client would wait on.
type frameConn struct {
	conn net.Conn
	br   *bufio.Reader
}

// dialRaw upgrades a TCP connection to r's home community and reads the
// AUTH challenge.
func dialRaw(t *testing.T, r *relaytest.Relay) *frameConn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(r.URL, "ws://"))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	_, err = fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", r.Host)
	require.NoError(t, err)
	c := &frameConn{conn: conn, br: bufio.NewReader(conn)}
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(relaytest.Patience)))
	resp, err := http.ReadResponse(c.br, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
	op, payload, err := c.frame()
	require.NoError(t, err)
	require.Equal(t, byte(0x1), op)
	require.Contains(t, string(payload), `["AUTH"`)
	return c
}

// frame reads one unfragmented frame from the relay.
func (c *frameConn) frame() (opcode byte, payload []byte, err error) {
	var h [2]byte
	if _, err := io.ReadFull(c.br, h[:]); err != nil {
		return 0, nil, err
	}
	n := int(h[1] & 0x7f)
	switch n {
	case 126:
		var ext [2]byte
		if _, err := io.ReadFull(c.br, ext[:]); err != nil {
			return 0, nil, err
		}
		n = int(ext[0])<<8 | int(ext[1])
	case 127:
		return 0, nil, errors.New("frame too large for this test")
	}
	payload = make([]byte, n)
	_, err = io.ReadFull(c.br, payload)
	return h[0] & 0x0f, payload, err
}

// pongs is the payloads of the pongs that arrive until the relay has been
// silent for quiet.
func (c *frameConn) pongs(t *testing.T, quiet time.Duration) []byte {
	t.Helper()
	var got []byte
	for {
		require.NoError(t, c.conn.SetReadDeadline(time.Now().Add(quiet)))
		op, payload, err := c.frame()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return got
		}
		require.NoError(t, err)
		require.Equal(t, byte(0xA), op, "only pongs are expected")
		got = append(got, payload...)
	}
}

// maskedFrame is a final client frame of opcode carrying payload (under
// 126 bytes), masked as a client must.
func maskedFrame(opcode byte, payload []byte) []byte {
	mask := [4]byte{1, 2, 3, 4}
	frame := []byte{0x80 | opcode, 0x80 | byte(len(payload)), mask[0], mask[1], mask[2], mask[3]}
	for i, b := range payload {
		frame = append(frame, b^mask[i%4])
	}
	return frame
}

// Shutdown completes while a ping flooder's hook waits for its bucket: the
// relay's close of the connection waits for the read the hook holds, so
// the hook gives way to a close. The clock stands still, so the hook's
// bucket never refills on its own.
// Mutation killed: pacePing waiting on the connection's context alone
// (Shutdown runs out its context with the flooder still open).
func TestShutdownCompletesWithAPacedPingFlooder(t *testing.T) {
	t.Parallel()
	now := time.Now()
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithClock(clock.Stub(func() time.Time { return now }))}, func(c *config.Config) {
		c.AuthTimeout = time.Hour
	})
	flooder := dialRaw(t, r)
	var pings []byte
	for i := range 50 {
		pings = append(pings, maskedFrame(0x9, []byte{byte(i)})...)
	}
	_, err := flooder.conn.Write(pings)
	require.NoError(t, err)
	waitMetric(t, r, "buzz_pings_paced_total", "1")

	// A bound on a hang, not a measure: Shutdown returns once every
	// connection is gone, or with the context's error.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, r.Shutdown(ctx), "every connection closed, the flooder's included")
}
