package media_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/media"
)

// benchBlobBytes is one benchmark blob: a 4 MiB photo-sized upload.
const benchBlobBytes = 4 << 20

func benchBlob(b *testing.B) []byte {
	blob := make([]byte, benchBlobBytes)
	_, err := rand.Read(blob)
	require.NoError(b, err)
	copy(blob, "\x89PNG\r\n\x1a\n")
	return blob
}

func benchService(b *testing.B, store media.Store) *media.Service {
	return media.NewService(store, media.Limits{MaxBytes: 1 << 30, AllowedTypes: []string{"image/png"}, TempDir: b.TempDir()}, nil)
}

// Upload throughput (hash while spooling, then store) per store; every
// iteration uploads new bytes so each stores a new blob.
func BenchmarkUpload(b *testing.B) {
	for name, open := range stores {
		b.Run(name, func(b *testing.B) {
			svc := benchService(b, open(b))
			blob := benchBlob(b)
			community := uuid.New()
			b.SetBytes(int64(len(blob)))
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				blob[100] = byte(i)
				blob[101] = byte(i >> 8)
				_, err := svc.Upload(context.Background(), community, "bench", bytes.NewReader(blob), nil)
				require.NoError(b, err)
			}
		})
	}
}

// Download throughput: open a community's blob and read it whole.
func BenchmarkDownload(b *testing.B) {
	for name, open := range stores {
		b.Run(name, func(b *testing.B) {
			svc := benchService(b, open(b))
			blob := benchBlob(b)
			community := uuid.New()
			d, err := svc.Upload(context.Background(), community, "bench", bytes.NewReader(blob), nil)
			require.NoError(b, err)
			b.SetBytes(int64(len(blob)))
			b.ResetTimer()
			for b.Loop() {
				_, obj, err := svc.Open(context.Background(), community, d.SHA256)
				require.NoError(b, err)
				n, err := io.Copy(io.Discard, obj)
				require.NoError(b, err)
				require.EqualValues(b, len(blob), n)
				obj.Close()
			}
		})
	}
}
