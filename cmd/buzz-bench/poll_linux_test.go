//go:build linux

package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"
)

// dialPlain connects a relayConn to url the way dialAuthed does, without
// AUTH.
func dialPlain(t *testing.T, url string) *relayConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var dialed dialedConn
	ws, _, err := websocket.Dial(context.WithValue(ctx, dialedConnKey{}, &dialed), url,
		&websocket.DialOptions{CompressionMode: websocket.CompressionDisabled, HTTPClient: wsHTTPClient})
	require.NoError(t, err)
	c := &relayConn{ws: ws}
	c.tcp, _ = dialed.conn.(*net.TCPConn)
	require.NotNil(t, c.tcp, "the plain connection is kept for the poller")
	return c
}

// Polled subscribers read every live event the server sends, small and
// larger than their buffer, once each, however the server repeats one;
// they answer the server's pings; other subscriptions' events and other
// messages are ignored.
// Mutations killed: no pong (the server's Ping fails); a frame larger than
// the buffer lost or cut; a second copy of an event counted; the poller
// not started (nothing received).
func TestPolledSubscribersReadEveryEventOnceAndAnswerPings(t *testing.T) {
	t.Parallel()
	const subscribers, events, runID = 3, 40, "pollrun"
	clock := newSendClock(1, events)
	pinged := make(chan error, subscribers)
	// The server sends nothing until the subscribers are polled, as the
	// relay sends nothing between EOSE and the first live event.
	polled := make(chan struct{})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
		if err != nil {
			return
		}
		defer ws.CloseNow()
		ctx := ws.CloseRead(context.Background()) // reads the pongs
		send := func(msg string) bool { return ws.Write(ctx, websocket.MessageText, []byte(msg)) == nil }
		<-polled
		for seq := range events {
			if seq == events/2 {
				pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
				pinged <- ws.Ping(pingCtx)
				cancel()
			}
			content := fmt.Sprintf("%s/0/%d lorem", runID, seq)
			if seq%7 == 0 {
				content += " " + strings.Repeat("x", 3*initialPollBuffer) // larger than the buffer
			}
			clock.mark(0, seq)
			ev := fmt.Sprintf(`["EVENT","%s",{"id":"%064d","content":"%s"}]`, liveSubID, seq, content)
			if !send(ev) || (seq%5 == 0 && !send(ev)) || // a repeated delivery
				!send(`["EVENT","other",{"id":"1","content":"`+content+`"}]`) || !send(`["NOTICE","hello"]`) {
				return
			}
		}
		<-ctx.Done()
	}))
	t.Cleanup(hs.Close)

	g := &subscriberGroup{}
	for range subscribers {
		g.subs = append(g.subs, &liveSubscriber{conn: dialPlain(t, "ws"+strings.TrimPrefix(hs.URL, "http")), expect: events})
	}
	var errs tally
	g.start(context.Background(), runID, clock, &errs)
	require.NotEmpty(t, g.pollers, "the subscribers are polled")
	close(polled)
	got := g.finish(context.Background(), subscribers*events, 30*time.Second)
	for range subscribers {
		require.NoError(t, <-pinged, "the server's ping was answered")
	}
	require.Len(t, got, subscribers*events, "every event, once, to every subscriber")
	require.Equal(t, subscribers*((events+4)/5), g.duplicates())
	rep := errs.report()
	require.Zero(t, rep.Count, "no read or decode error: %v", rep.First)
}

// A polled subscriber also records when each delivery reached its socket,
// not only when it read it: an event that waited in the socket while the
// poller was busy elsewhere (here: not started yet) gets the read's
// latency with the wait in it, and the arrival latency without it.
// Mutations killed: the socket not asked for receive timestamps, or the
// control message ignored (the arrival is then the read, wait included);
// an arrival later than the read.
func TestPolledSubscribersRecordArrivalBeforeTheirRead(t *testing.T) {
	t.Parallel()
	const runID, wait = "arrivalrun", 300 * time.Millisecond
	receiveStampsOn(t)
	clock := newSendClock(1, 1)
	dialed, sent := make(chan struct{}), make(chan struct{})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
		if err != nil {
			return
		}
		defer ws.CloseNow()
		ctx := ws.CloseRead(context.Background())
		// Sent once the client's handshake is done, the event waits in the
		// socket, not in the WebSocket library's buffer.
		<-dialed
		clock.mark(0, 0)
		ev := fmt.Sprintf(`["EVENT","%s",{"id":"%064d","content":"%s/0/0 lorem"}]`, liveSubID, 0, runID)
		if ws.Write(ctx, websocket.MessageText, []byte(ev)) != nil {
			return
		}
		close(sent)
		<-ctx.Done()
	}))
	t.Cleanup(hs.Close)

	sub := &liveSubscriber{conn: dialPlain(t, "ws"+strings.TrimPrefix(hs.URL, "http")), expect: 1}
	g := &subscriberGroup{subs: []*liveSubscriber{sub}}
	close(dialed)
	<-sent
	time.Sleep(wait) // the event waits in the socket, unread
	var errs tally
	g.start(context.Background(), runID, clock, &errs)
	require.NotEmpty(t, g.pollers, "the subscriber is polled")
	read := g.finish(context.Background(), 1, 30*time.Second)
	require.Len(t, read, 1)
	arrivals := g.arrivals()
	require.Len(t, arrivals, 1, "the polled read knew the arrival")
	require.GreaterOrEqual(t, read[0], wait, "the read came after the wait")
	require.GreaterOrEqual(t, arrivals[0], time.Duration(0))
	require.Less(t, arrivals[0], read[0]-wait/2, "the arrival leaves the wait out")
}

// Without a receive timestamp among the control messages, the arrival is
// the read itself: never earlier than known.
func TestArrivalWithoutAStampIsTheRead(t *testing.T) {
	t.Parallel()
	require.Equal(t, int64(5000), arrivalStamp(nil, 5000, 9000))
	require.Equal(t, int64(5000), arrivalStamp(make([]byte, 64), 5000, 9000), "a zeroed buffer holds no message")
}

// receiveStampsOn makes sure the kernel stamps what sockets receive while
// the test runs. It stamps only while some socket asks for stamps, and
// starts doing so a moment after the first one asks (the switch is made
// on a work queue); the event the test above leaves unread arrives before
// the poller asks. A probe socket asks, is kept until the test ends, and
// is written to until a stamp it reads is older than its read.
func receiveStampsOn(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	sender, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { sender.Close() })
	accepted, err := ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { accepted.Close() })
	raw, err := accepted.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	require.NoError(t, raw.Control(func(fd uintptr) {
		require.NoError(t, syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1))
	}))
	buf, oob := make([]byte, 64), make([]byte, 64)
	require.Eventually(t, func() bool {
		if _, err := sender.Write([]byte{1}); err != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
		stamped := false
		_ = raw.Read(func(fd uintptr) bool {
			_, oobn, _, _, err := syscall.Recvmsg(int(fd), buf, oob, 0)
			if err == nil {
				wall := time.Now()
				now := int64(wall.Sub(epoch)) + 1
				stamped = now-arrivalStamp(oob[:oobn], now, wall.UnixNano()) >= int64(10*time.Millisecond)
			}
			return true
		})
		return stamped
	}, 10*time.Second, time.Millisecond, "the kernel stamps received segments")
}
