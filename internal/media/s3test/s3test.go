// Package s3test runs a real S3-protocol server on loopback for tests:
// gofakes3 with an in-memory backend, served over HTTP inside the test
// process, so the S3 store is exercised through minio-go's real requests
// (signing, ranged GETs, listings) without a server binary to build or
// install.
package s3test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/media"
)

// Bucket is the bucket Start creates.
const Bucket = "buzz-media"

// Start serves a fresh, empty S3 server with one bucket until the test
// ends and returns how to reach it.
func Start(t testing.TB) media.S3Config {
	cfg, _ := StartCounted(t)
	return cfg
}

// Traffic counts what the server sent for GET requests: requests and body
// bytes, the store's egress a relay pays for.
type Traffic struct {
	GETs     atomic.Int64
	BytesOut atomic.Int64
	active   atomic.Int64
}

// Idle reports whether no request is being answered: a response the
// client abandoned is counted in full only once its handler gave up.
func (t *Traffic) Idle() bool { return t.active.Load() == 0 }

// StartCounted is Start, also counting the server's GET traffic.
func StartCounted(t testing.TB) (media.S3Config, *Traffic) {
	t.Helper()
	cfg, traffic, _ := start(t)
	return cfg, traffic
}

// StartStoppable is Start, with stop taking the server away before the
// test ends: its address then refuses connections, as a store the network
// no longer reaches.
func StartStoppable(t testing.TB) (cfg media.S3Config, stop func()) {
	t.Helper()
	cfg, _, srv := start(t)
	return cfg, srv.Close
}

func start(t testing.TB) (media.S3Config, *Traffic, *httptest.Server) {
	t.Helper()
	backend := s3mem.New()
	require.NoError(t, backend.CreateBucket(Bucket))
	traffic := &Traffic{}
	s3 := gofakes3.New(backend).Server()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		traffic.active.Add(1)
		defer traffic.active.Add(-1)
		if r.Method == http.MethodGet {
			traffic.GETs.Add(1)
			w = countingWriter{w, &traffic.BytesOut}
		}
		s3.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return media.S3Config{
		Endpoint:  strings.TrimPrefix(srv.URL, "http://"),
		Bucket:    Bucket,
		AccessKey: "test-access-key",
		SecretKey: "test-secret-key",
		Region:    "us-east-1",
	}, traffic, srv
}

type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// Store is an S3Store on a fresh server.
func Store(t testing.TB) *media.S3Store {
	t.Helper()
	s, err := media.NewS3Store(Start(t))
	require.NoError(t, err)
	return s
}
