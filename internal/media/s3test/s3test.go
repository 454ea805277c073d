// Package s3test runs a real S3-protocol server on loopback for tests:
// gofakes3 with an in-memory backend, served over HTTP inside the test
// process, so the S3 store is exercised through minio-go's real requests
// (signing, ranged GETs, listings) without a server binary to build or
// install.
package s3test

import (
	"net/http/httptest"
	"strings"
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
	t.Helper()
	backend := s3mem.New()
	require.NoError(t, backend.CreateBucket(Bucket))
	srv := httptest.NewServer(gofakes3.New(backend).Server())
	t.Cleanup(srv.Close)
	return media.S3Config{
		Endpoint:  strings.TrimPrefix(srv.URL, "http://"),
		Bucket:    Bucket,
		AccessKey: "test-access-key",
		SecretKey: "test-secret-key",
		Region:    "us-east-1",
	}
}

// Store is an S3Store on a fresh server.
func Store(t testing.TB) *media.S3Store {
	t.Helper()
	s, err := media.NewS3Store(Start(t))
	require.NoError(t, err)
	return s
}
