package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// The listener scenario measures mention -> operator listener end to end
// through the relay: a client publishes a channel message mentioning a
// registered target and waits for its OK; the bench's own HTTPS listener
// takes the relay's POST. Reported is OK -> POST received, both seen by
// this process on one clock: spaced mentions, then one after a long idle.
//
// The relay must route the bench's listener, so `buzz-bench listener-setup
// DIR` runs before the relay starts. It writes the listener's key and a
// self-signed certificate for 127.0.0.1, and prints the pubkey; the relay
// is started with
//
//	BUZZ_OPERATOR_LISTENERS=<pubkey>:https://127.0.0.1:PORT/hook
//	RELAY_OPERATOR_API_ORIGIN=<-url as http(s)>
//	SSL_CERT_FILE=DIR/cert.pem (Go's roots on Linux: the relay trusts it)
//
// and the bench with -listener-dir DIR -listener-addr 127.0.0.1:PORT.

// listenerHookPath is the path the relay's route names.
const listenerHookPath = "/hook"

// listenerReport is the result of the listener scenario, in milliseconds. A
// latency is negative when the POST arrived before the client read its OK.
type listenerReport struct {
	Mentions    int     `json:"mentions"`
	Delivered   int     `json:"delivered"`
	MedianMs    float64 `json:"median_ms"`
	P90Ms       float64 `json:"p90_ms"`
	MaxMs       float64 `json:"max_ms"`
	FirstMs     float64 `json:"first_ms"`
	AfterIdleMs float64 `json:"after_idle_ms"`
	IdleSeconds float64 `json:"idle_s"`
	KeepAlives  int     `json:"keepalives_seen"` // the relay's HEADs that kept the connection warm
	Error       string  `json:"error,omitempty"`
}

// runListenerSetup is `buzz-bench listener-setup DIR`.
func runListenerSetup(args []string, stdout io.Writer) error {
	if len(args) != 1 {
		return errors.New("usage: buzz-bench listener-setup DIR")
	}
	dir := args[0]
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	key, err := nostr.GenerateSecretKey()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "listener.key"), []byte(key.Hex()+"\n"), 0o600); err != nil {
		return err
	}
	certPEM, keyPEM, err := selfSignedLoopbackCert()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "cert.pem"), certPEM, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "key.pem"), keyPEM, 0o600); err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, key.PublicKeyHex())
	return err
}

// selfSignedLoopbackCert makes a certificate for 127.0.0.1 and localhost
// that is its own root, valid for a day.
func selfSignedLoopbackCert() (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "buzz-bench operator listener"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// benchListener is the bench's operator listener: it answers the relay's
// keep-alive HEADs and records when each POST about an event arrived.
type benchListener struct {
	srv *http.Server
	ln  net.Listener
	key *nostr.SecretKey // the listener's: registration requests are NIP-98 signed with it

	mu         sync.Mutex
	keepAlives int
	posted     map[string]chan time.Time // event id -> its POST's arrival
}

// startBenchListener serves HTTPS on addr with DIR's certificate; it runs
// from the bench's start, so the relay's keep-alive has warmed a connection
// by the time the scenario runs, as it would for a listener that is up.
func startBenchListener(dir, addr string) (*benchListener, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "listener.key"))
	if err != nil {
		return nil, err
	}
	key, err := nostr.SecretKeyFromHex(strings.TrimSpace(string(raw)))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, "listener.key"), err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"))
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	l := &benchListener{
		ln:     ln,
		key:    key,
		posted: map[string]chan time.Time{},
	}
	l.srv = &http.Server{
		Handler:           http.HandlerFunc(l.serveHTTP),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		// A common server default: without the relay's keep-alive, the
		// connection would be gone before the mention after idle.
		IdleTimeout: time.Minute,
	}
	go func() { _ = l.srv.ServeTLS(ln, "", "") }()
	return l, nil
}

func (l *benchListener) serveHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	if r.Method == http.MethodHead {
		l.mu.Lock()
		l.keepAlives++
		l.mu.Unlock()
		return
	}
	var body struct {
		EventID string `json:"event_id"`
	}
	if r.Method != http.MethodPost || r.URL.Path != listenerHookPath ||
		json.NewDecoder(io.LimitReader(r.Body, 4<<10)).Decode(&body) != nil {
		http.Error(w, "not a delivery", http.StatusBadRequest)
		return
	}
	select {
	case l.arrival(body.EventID) <- at:
	default: // a redelivery: the first arrival counts
	}
}

// arrival is the channel the POST about id reports its arrival on.
func (l *benchListener) arrival(id string) chan time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch, ok := l.posted[id]
	if !ok {
		ch = make(chan time.Time, 1)
		l.posted[id] = ch
	}
	return ch
}

func (l *benchListener) keepAlivesSeen() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.keepAlives
}

// close lets a POST being answered finish, so the relay does not retry
// the last mention at the bench's exit.
func (l *benchListener) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = l.srv.Shutdown(ctx)
}

// addr is the address it listens on.
func (l *benchListener) addr() string { return l.ln.Addr().String() }

// registrationBody is the operator listener API's request naming target,
// encoded by encoding/json so that no value can break out of its string.
func registrationBody(target string) ([]byte, error) {
	return json.Marshal(struct {
		Pubkeys []string `json:"pubkeys"`
	}{[]string{target}})
}

// register asks the relay to page this listener for target.
func (l *benchListener) register(ctx context.Context, origin, target string) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout) // the scenario's context has no deadline
	defer cancel()
	endpoint := origin + "/operator/listener/pubkeys"
	body, err := registrationBody(target)
	if err != nil {
		return err
	}
	auth, err := nostr.HTTPAuthHeader(l.key, http.MethodPost, endpoint, body, time.Now())
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", auth)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("registering the target: %s %s (is the relay started with RELAY_OPERATOR_API_ORIGIN=%s and this listener in BUZZ_OPERATOR_LISTENERS?)",
			resp.Status, strings.TrimSpace(string(msg)), origin)
	}
	return nil
}

// httpOrigin is the relay's HTTP origin for its WebSocket URL.
func httpOrigin(wsURL string) string {
	if rest, ok := strings.CutPrefix(wsURL, "wss://"); ok {
		return "https://" + strings.TrimSuffix(rest, "/")
	}
	return "http://" + strings.TrimSuffix(strings.TrimPrefix(wsURL, "ws://"), "/")
}

// runListener publishes o.listenerMentions mentions o.listenerSpacing
// (plus up to 60% more, at random) apart, then one after o.listenerIdle.
func runListener(ctx context.Context, o options, l *benchListener) *listenerReport {
	rep := &listenerReport{IdleSeconds: o.listenerIdle.Seconds()}
	fail := func(format string, args ...any) *listenerReport {
		rep.Error = fmt.Sprintf(format, args...)
		logf("listener: %s", rep.Error)
		return rep
	}
	target, err := newSigner()
	if err != nil {
		return fail("%v", err)
	}
	if err := l.register(ctx, httpOrigin(o.url), target.pubHex); err != nil {
		return fail("%v", err)
	}
	s, err := newSigner()
	if err != nil {
		return fail("%v", err)
	}
	// Each publish dials its own connection, before the OK -> POST clock
	// starts: a client that does not read answers no ping, and the relay
	// closes a connection quiet past its ping interval (30 s by default),
	// as this one is while it waits for the keep-alive and through the idle.
	publish := func(ev *nostr.Event) (ok bool, reason string, okAt time.Time, err error) {
		c, err := dialAuthed(ctx, o.url, s)
		if err != nil {
			return false, "", time.Time{}, err
		}
		defer c.close()
		ok, reason, err = c.publish(ctx, signedEvent{frame: eventFrame("EVENT", ev), id: ev.ID})
		return ok, reason, time.Now(), err
	}
	channel := uuid.NewString()
	create := &nostr.Event{Kind: 9007, CreatedAt: time.Now().Unix(), Tags: nostr.Tags{{"h", channel}, {"name", "bench-listener-" + o.runID}}}
	if err := s.sign(create); err != nil {
		return fail("%v", err)
	}
	if ok, reason, _, err := publish(create); err != nil || !ok {
		return fail("creating the channel: %v %s", err, reason)
	}
	// The relay HEADs a listener whose connection has been quiet for its
	// keep-alive interval (20 s by default); one HEAD means a warm
	// connection exists, as it would for any listener up for a while.
	logf("listener: waiting for the relay's first keep-alive")
	for deadline := time.Now().Add(time.Minute); l.keepAlivesSeen() == 0; {
		if time.Now().After(deadline) {
			return fail("no keep-alive HEAD from the relay within a minute: is BUZZ_OPERATOR_LISTENERS naming this listener?")
		}
		select {
		case <-ctx.Done():
			return fail("interrupted")
		case <-time.After(100 * time.Millisecond):
		}
	}

	mention := func(seq int) (time.Duration, error) {
		ev := &nostr.Event{Kind: 9, CreatedAt: time.Now().Unix(), Content: fmt.Sprintf("mention %d of run %s", seq, o.runID),
			Tags: nostr.Tags{{"h", channel}, {"p", target.pubHex}}}
		if err := s.sign(ev); err != nil {
			return 0, err
		}
		posted := l.arrival(ev.ID)
		ok, reason, okAt, err := publish(ev)
		if err != nil || !ok {
			return 0, fmt.Errorf("mention refused: %v %s", err, reason)
		}
		select {
		case at := <-posted:
			return at.Sub(okAt), nil
		case <-time.After(10 * time.Second):
			return 0, errors.New("no POST within 10 s of the OK")
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	var spaced []time.Duration
	logf("listener: %d mentions %s-%s apart, then one after %s idle", o.listenerMentions, o.listenerSpacing, o.listenerSpacing*16/10, o.listenerIdle)
	for i := range o.listenerMentions {
		next := time.Now().Add(o.listenerSpacing + randDuration(o.listenerSpacing*6/10))
		d, err := mention(i)
		rep.Mentions++
		if err != nil {
			return fail("mention %d: %v", i, err)
		}
		rep.Delivered++
		spaced = append(spaced, d)
		select {
		case <-ctx.Done():
			return fail("interrupted")
		case <-time.After(time.Until(next)):
		}
	}
	select {
	case <-ctx.Done():
		return fail("interrupted")
	case <-time.After(o.listenerIdle):
	}
	late, err := mention(o.listenerMentions)
	rep.Mentions++
	if err != nil {
		return fail("the mention after idle: %v", err)
	}
	rep.Delivered++
	rep.FirstMs, rep.AfterIdleMs = millis(spaced[0]), millis(late)
	st := summarize(append(spaced, late))
	rep.MedianMs, rep.P90Ms, rep.MaxMs = st.P50, st.P90, st.Max
	rep.KeepAlives = l.keepAlivesSeen()
	return rep
}

// randDuration is uniform in [0, d].
func randDuration(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	n, err := rand.Int(rand.Reader, big.NewInt(int64(d)+1))
	if err != nil {
		return 0
	}
	return time.Duration(n.Int64())
}
