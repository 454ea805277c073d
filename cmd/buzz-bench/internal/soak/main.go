// Command soak churns clients against a running relay for a long time, so an
// operator can watch what the relay holds (goroutines, descriptors, memory,
// database backends, Redis clients, bookkeeping rows) grow under load and
// come back after it. It is a manual tool, run next to a relay started with
// its own PostgreSQL and redis-server; see docs/limits.md ("Watching a relay
// under churn").
//
//	soak -url ws://localhost:47300 -listener-dir DIR -listener-addr 127.0.0.1:47302 -duration 20m
//
// Every worker loops until -duration ends: connect/AUTH/disconnect (go-nostr),
// connections reset mid-frame, REQ/CLOSE churn left open when the connection
// dies, publishes reset before their OK, mentions to a listener that hangs or
// resets, media uploads reset mid-body, presence and typing, COUNT and search.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gonostr "github.com/nbd-wtf/go-nostr"
)

var (
	relayURL     = flag.String("url", "ws://localhost:47300", "the relay's WebSocket URL")
	duration     = flag.Duration("duration", 20*time.Minute, "how long to churn")
	workers      = flag.Int("workers", 2, "goroutines per kind of churn")
	listenerDir  = flag.String("listener-dir", "", "the directory `buzz-bench listener-setup` wrote (empty: no listener)")
	listenerAddr = flag.String("listener-addr", "127.0.0.1:47302", "where the listener serves")
)

var closedOnce, timeoutOnce atomic.Bool

var counts sync.Map // name -> *atomic.Int64

func count(name string) {
	v, _ := counts.LoadOrStore(name, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func main() {
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), *duration)
	defer cancel()

	owner := gonostr.GeneratePrivateKey()
	channel := newUUID()
	target := gonostr.GeneratePrivateKey()
	targetPub, _ := gonostr.GetPublicKey(target)
	members := make([]string, 16)
	for i := range members {
		members[i] = gonostr.GeneratePrivateKey()
	}
	setup(ctx, owner, channel, members)
	if *listenerDir != "" {
		startListener(ctx, targetPub)
	}

	var wg sync.WaitGroup
	loop := func(name string, f func(ctx context.Context)) {
		for range *workers {
			wg.Go(func() {
				for ctx.Err() == nil {
					f(ctx)
					count(name)
				}
			})
		}
	}
	member := func() string { return members[mrand.IntN(len(members))] }
	loop("auth_churn", func(ctx context.Context) { authChurn(ctx) })
	loop("reset_mid_frame", func(ctx context.Context) { resetMidFrame(ctx) })
	loop("never_read", func(ctx context.Context) { neverRead(ctx, member(), channel) })
	loop("req_churn", func(ctx context.Context) { reqChurn(ctx, member(), channel) })
	loop("publish_reset", func(ctx context.Context) { publishReset(ctx, member(), channel) })
	loop("mention", func(ctx context.Context) { mention(ctx, member(), channel, targetPub) })
	loop("media_abort", func(ctx context.Context) { mediaAbort(ctx, member()) })
	loop("presence", func(ctx context.Context) { presence(ctx, member(), channel) })
	loop("count_search", func(ctx context.Context) { countSearch(ctx, member(), channel) })

	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			report()
			return
		case <-tick.C:
			report()
		}
	}
}

func report() {
	var parts []string
	counts.Range(func(k, v any) bool {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v.(*atomic.Int64).Load()))
		return true
	})
	fmt.Println(time.Now().UTC().Format(time.TimeOnly), strings.Join(parts, " "))
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func sign(sk string, kind int, content string, tags gonostr.Tags) gonostr.Event {
	ev := gonostr.Event{Kind: kind, CreatedAt: gonostr.Now(), Content: content, Tags: tags}
	if err := ev.Sign(sk); err != nil {
		log.Fatal(err)
	}
	return ev
}

// connect dials with go-nostr and authenticates as sk (the challenge may
// arrive a moment after the upgrade).
func connect(ctx context.Context, sk string) (*gonostr.Relay, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := gonostr.RelayConnect(cctx, *relayURL)
	if err != nil {
		count("connect_error")
		return nil, err
	}
	for range 50 {
		err = r.Auth(cctx, func(ev *gonostr.Event) error { return ev.Sign(sk) })
		if err == nil {
			return r, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	count("auth_error")
	r.Close()
	return nil, err
}

func setup(ctx context.Context, owner, channel string, members []string) {
	r, err := connect(ctx, owner)
	if err != nil {
		log.Fatal("owner connect: ", err)
	}
	defer r.Close()
	if err := r.Publish(ctx, sign(owner, 9007, "", gonostr.Tags{{"h", channel}, {"name", "soak"}})); err != nil {
		log.Fatal("create channel: ", err)
	}
	for _, m := range members {
		mr, err := connect(ctx, m)
		if err != nil {
			log.Fatal("member connect: ", err)
		}
		if err := mr.Publish(ctx, sign(m, 9021, "", gonostr.Tags{{"h", channel}})); err != nil {
			log.Fatal("join: ", err)
		}
		mr.Close()
	}
}

func authChurn(ctx context.Context) {
	r, err := connect(ctx, gonostr.GeneratePrivateKey())
	if err == nil {
		r.Close()
	}
}

// rawConn is a TCP connection upgraded to WebSocket by hand, so frames can be
// cut short and the connection reset (SO_LINGER 0).
type rawConn struct {
	c   *net.TCPConn
	buf []byte // what was read after the upgrade response
}

func dialRaw() (*rawConn, error) {
	host := strings.TrimPrefix(*relayURL, "ws://")
	c, err := net.DialTimeout("tcp", host, 5*time.Second)
	if err != nil {
		count("connect_error")
		return nil, err
	}
	key := make([]byte, 16)
	_, _ = rand.Read(key)
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n",
		host, base64.StdEncoding.EncodeToString(key))
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var got []byte
	b := make([]byte, 4096)
	for !bytes.Contains(got, []byte("\r\n\r\n")) {
		n, err := c.Read(b)
		if err != nil {
			c.Close()
			return nil, err
		}
		got = append(got, b[:n]...)
	}
	if !bytes.HasPrefix(got, []byte("HTTP/1.1 101")) {
		c.Close()
		count("upgrade_refused")
		return nil, fmt.Errorf("upgrade: %q", got[:min(len(got), 80)])
	}
	_, rest, _ := bytes.Cut(got, []byte("\r\n\r\n"))
	return &rawConn{c: c.(*net.TCPConn), buf: rest}, nil
}

// frame is a masked client text frame.
func frame(payload []byte) []byte {
	var h []byte
	switch n := len(payload); {
	case n < 126:
		h = []byte{0x81, 0x80 | byte(n)}
	case n < 65536:
		h = []byte{0x81, 0x80 | 126, byte(n >> 8), byte(n)}
	default:
		h = []byte{0x81, 0x80 | 127, 0, 0, 0, 0, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
	}
	mask := []byte{1, 2, 3, 4}
	out := append(h, mask...)
	for i, c := range payload {
		out = append(out, c^mask[i%4])
	}
	return out
}

func (r *rawConn) send(msg any) {
	b, _ := json.Marshal(msg)
	_, _ = r.c.Write(frame(b))
}

// challenge reads frames until the AUTH challenge (the relay sends it first).
func (r *rawConn) challenge() string {
	_ = r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, 4096)
	for {
		if i := bytes.Index(r.buf, []byte(`["AUTH","`)); i >= 0 {
			rest := r.buf[i+9:]
			if j := bytes.IndexByte(rest, '"'); j >= 0 {
				return string(rest[:j])
			}
		}
		n, err := r.c.Read(b)
		if err != nil {
			return ""
		}
		r.buf = append(r.buf, b[:n]...)
	}
}

func (r *rawConn) auth(sk string) {
	ch := r.challenge()
	r.send([]any{"AUTH", sign(sk, 22242, "", gonostr.Tags{{"relay", *relayURL}, {"challenge", ch}})})
}

func (r *rawConn) reset() {
	_ = r.c.SetLinger(0)
	_ = r.c.Close()
}

func resetMidFrame(ctx context.Context) {
	r, err := dialRaw()
	if err != nil {
		return
	}
	full := frame([]byte(`["REQ","half",{"kinds":[1],"limit":10}]`))
	switch mrand.IntN(3) {
	case 0: // half a header
		_, _ = r.c.Write(full[:1])
	case 1: // header promising more than is sent
		_, _ = r.c.Write(full[:len(full)/2])
	default: // a large frame's first bytes
		_, _ = r.c.Write(frame(bytes.Repeat([]byte("x"), 60000))[:3000])
	}
	r.reset()
}

// neverRead subscribes to the channel's history and live events, never reads,
// and lets the connection die (reset, or closed while the relay writes).
func neverRead(ctx context.Context, sk, channel string) {
	r, err := dialRaw()
	if err != nil {
		return
	}
	r.auth(sk)
	for i := range 8 {
		r.send([]any{"REQ", "nr" + strconv.Itoa(i), map[string]any{"kinds": []int{9, 20001, 20002}, "#h": []string{channel}}})
	}
	sleep(ctx, time.Duration(500+mrand.IntN(3000))*time.Millisecond)
	if mrand.IntN(2) == 0 {
		r.reset()
	} else {
		_ = r.c.Close()
	}
}

func reqChurn(ctx context.Context, sk, channel string) {
	r, err := connect(ctx, sk)
	if err != nil {
		return
	}
	for i := range 20 {
		var filters gonostr.Filters
		for j := range 1 + mrand.IntN(8) {
			f := gonostr.Filter{Kinds: []int{9, 1 + j}, Tags: gonostr.TagMap{"h": {channel}}, Limit: 5}
			if j%2 == 1 {
				f.Authors = []string{randHex(), randHex()}
			}
			filters = append(filters, f)
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		sub, err := r.Subscribe(sctx, filters)
		if err != nil {
			cancel()
			break
		}
		go func() { // go-nostr hands EOSE on only after the events before it were taken
			for range sub.Events {
			}
		}()
		select {
		case <-sub.EndOfStoredEvents:
		case reason := <-sub.ClosedReason:
			count("req_closed")
			if closedOnce.CompareAndSwap(false, true) {
				log.Print("REQ closed: ", reason)
			}
		case <-sctx.Done():
			count("req_timeout")
			if timeoutOnce.CompareAndSwap(false, true) {
				log.Printf("REQ timed out: %v", filters)
			}
		}
		if i%3 != 0 {
			sub.Unsub()
		}
		cancel()
		count("req")
	}
	// The subscriptions not closed above die with the connection.
	r.Close()
}

func randHex() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// publishReset sends a channel message and resets before the OK.
func publishReset(ctx context.Context, sk, channel string) {
	r, err := dialRaw()
	if err != nil {
		return
	}
	r.auth(sk)
	time.Sleep(5 * time.Millisecond)
	r.send([]any{"EVENT", sign(sk, 9, "reset before ok "+randHex()[:8], gonostr.Tags{{"h", channel}})})
	r.reset()
}

func mention(ctx context.Context, sk, channel, target string) {
	r, err := connect(ctx, sk)
	if err != nil {
		return
	}
	defer r.Close()
	for range 5 {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := r.Publish(pctx, sign(sk, 9, "hey soak word "+randHex()[:6], gonostr.Tags{{"h", channel}, {"p", target}}))
		cancel()
		if err != nil {
			count("mention_error")
			if strings.Contains(err.Error(), "rate-limited") {
				sleep(ctx, time.Second)
			}
		}
	}
}

func mediaAbort(ctx context.Context, sk string) {
	host := strings.TrimPrefix(*relayURL, "ws://")
	blob := make([]byte, 200_000)
	_, _ = rand.Read(blob)
	copy(blob, "\x89PNG\r\n\x1a\n") // sniffed as image/png
	complete := mrand.IntN(4) == 0
	sum := sha256.Sum256(blob)
	ev := sign(sk, 24242, "upload blob", gonostr.Tags{{"t", "upload"}, {"x", hex.EncodeToString(sum[:])},
		{"expiration", strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)}})
	if mrand.IntN(2) == 0 { // NIP-98 instead of Blossom: each is claimed once (http_auth_replays)
		ev = sign(sk, 27235, "", gonostr.Tags{{"u", "http://" + host + "/media/upload"}, {"method", "PUT"},
			{"payload", hex.EncodeToString(sum[:])}})
	}
	j, _ := json.Marshal(ev)
	c, err := net.DialTimeout("tcp", host, 5*time.Second)
	if err != nil {
		return
	}
	tc := c.(*net.TCPConn)
	fmt.Fprintf(tc, "PUT /media/upload HTTP/1.1\r\nHost: %s\r\nAuthorization: Nostr %s\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n",
		host, base64.StdEncoding.EncodeToString(j), len(blob))
	if complete {
		_, _ = tc.Write(blob)
		_ = tc.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err == nil {
			count("media_" + strconv.Itoa(resp.StatusCode))
			resp.Body.Close()
		}
		_ = tc.Close()
		return
	}
	_, _ = tc.Write(blob[:1024+mrand.IntN(len(blob)/2)])
	sleep(ctx, time.Duration(mrand.IntN(500))*time.Millisecond)
	if mrand.IntN(2) == 0 {
		_ = tc.SetLinger(0)
	}
	_ = tc.Close()
}

func presence(ctx context.Context, sk, channel string) {
	r, err := connect(ctx, sk)
	if err != nil {
		return
	}
	defer r.Close()
	for range 10 {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_ = r.Publish(pctx, sign(sk, 20001, `{"status":"online"}`, gonostr.Tags{{"h", channel}}))
		_ = r.Publish(pctx, sign(sk, 20002, "", gonostr.Tags{{"h", channel}}))
		cancel()
	}
}

func countSearch(ctx context.Context, sk, channel string) {
	r, err := connect(ctx, sk)
	if err != nil {
		return
	}
	defer r.Close()
	for range 5 {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if _, _, err := r.Count(cctx, gonostr.Filters{{Kinds: []int{9}, Tags: gonostr.TagMap{"h": {channel}}}}); err != nil {
			count("count_error")
		}
		_, _ = r.QuerySync(cctx, gonostr.Filter{Kinds: []int{9}, Search: "soak", Tags: gonostr.TagMap{"h": {channel}}, Limit: 20})
		_, _, _ = r.Count(cctx, gonostr.Filters{{Kinds: []int{20001}, Tags: gonostr.TagMap{"h": {channel}}}})
		cancel()
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// startListener serves the operator listener: it registers target, then
// answers each POST by hanging, resetting or accepting.
func startListener(ctx context.Context, target string) {
	keyHex, err := os.ReadFile(filepath.Join(*listenerDir, "listener.key"))
	if err != nil {
		log.Fatal(err)
	}
	sk := strings.TrimSpace(string(keyHex))
	cert, err := tls.LoadX509KeyPair(filepath.Join(*listenerDir, "cert.pem"), filepath.Join(*listenerDir, "key.pem"))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/hook", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			return
		}
		count("listener_post")
		switch mrand.IntN(3) {
		case 0: // hang until the relay gives up
			<-r.Context().Done()
		case 1: // reset
			if hj, ok := w.(http.Hijacker); ok {
				c, _, err := hj.Hijack()
				if err == nil {
					if tc, ok := c.(*tls.Conn); ok {
						if nc, ok := tc.NetConn().(*net.TCPConn); ok {
							_ = nc.SetLinger(0)
						}
					}
					_ = c.Close()
				}
			}
		default:
			_, _ = io.Copy(io.Discard, r.Body)
		}
	})
	ln, err := tls.Listen("tcp", *listenerAddr, &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	go func() { <-ctx.Done(); _ = srv.Close() }()

	origin := "http://" + strings.TrimPrefix(*relayURL, "ws://")
	endpoint := origin + "/operator/listener/pubkeys"
	body, _ := json.Marshal(map[string]any{"pubkeys": []string{target}})
	sum := sha256.Sum256(body)
	ev := sign(sk, 27235, "", gonostr.Tags{{"u", endpoint}, {"method", "POST"}, {"payload", hex.EncodeToString(sum[:])}})
	j, _ := json.Marshal(ev)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	req.Header.Set("Authorization", "Nostr "+base64.StdEncoding.EncodeToString(j))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal("register: ", err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		log.Fatalf("register: %s %s", resp.Status, msg)
	}
}
