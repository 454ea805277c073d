package media

import (
	"crypto/rand"
	"encoding/binary"
	"strings"
	"time"

	"github.com/google/uuid"
)

// extensions maps the media types the relay can sniff to the extension of
// the blob key. A blob's type comes from its bytes, so every community
// uploading the same bytes names the same key.
var extensions = map[string]string{
	"image/png":       "png",
	"image/jpeg":      "jpg",
	"image/gif":       "gif",
	"image/webp":      "webp",
	"image/bmp":       "bmp",
	"image/x-icon":    "ico",
	"video/mp4":       "mp4",
	"video/webm":      "webm",
	"video/avi":       "avi",
	"audio/mpeg":      "mp3",
	"audio/ogg":       "ogg",
	"audio/wave":      "wav",
	"audio/aiff":      "aiff",
	"audio/midi":      "mid",
	"application/ogg": "ogg",
	"application/pdf": "pdf",
	"application/zip": "zip",
	"font/woff":       "woff",
	"font/woff2":      "woff2",
	"text/plain":      "txt",
}

// extensionOf is the blob key's extension for mediaType ("bin" for types
// without one of their own).
func extensionOf(mediaType string) string {
	if ext, ok := extensions[mediaType]; ok {
		return ext
	}
	return "bin"
}

func blobKey(sha, mediaType string) string { return sha + "." + extensionOf(mediaType) }

func sidecarKey(community uuid.UUID, sha string) string {
	return "_meta/" + community.String() + "/" + sha + ".json"
}

func uploadsPrefix(community uuid.UUID, sha string) string {
	return "_uploads/" + community.String() + "/" + sha + "/"
}

// isSHA256Hex reports whether s is 64 lowercase hex digits, the only
// spelling a key uses.
func isSHA256Hex(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// maxExtensionLen bounds the extension a client may append to a blob's
// hash in its URL.
const maxExtensionLen = 16

// ParseBlobName reads the last path segment of /media/{sha256}[.ext]: a
// 64-digit hex hash (either case; returned lowercase) and an optional
// extension of 1 to 16 ASCII letters and digits. The extension is a hint
// for the client's benefit and never selects the blob.
func ParseBlobName(name string) (sha, ext string, ok bool) {
	sha, ext, dotted := strings.Cut(name, ".")
	sha = strings.ToLower(sha)
	if !isSHA256Hex(sha) {
		return "", "", false
	}
	if !dotted {
		return sha, "", true
	}
	if ext == "" || len(ext) > maxExtensionLen {
		return "", "", false
	}
	for i := 0; i < len(ext); i++ {
		c := ext[i]
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			return "", "", false
		}
	}
	return sha, ext, true
}

// crockford is the ULID alphabet (Crockford's base32, uppercase).
const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// newULID is a ULID for an upload record: 48 bits of milliseconds then 80
// random bits, 26 Crockford characters, so a prefix listing returns a
// community's uploads of one blob oldest first.
func newULID(at time.Time) string {
	var b [16]byte
	ms := uint64(at.UnixMilli())
	binary.BigEndian.PutUint16(b[0:2], uint16(ms>>32))
	binary.BigEndian.PutUint32(b[2:6], uint32(ms))
	_, _ = rand.Read(b[6:]) // crypto/rand never fails on supported platforms
	// 128 bits as 26 5-bit digits, the first carrying the top 3 bits.
	hi := binary.BigEndian.Uint64(b[0:8])
	lo := binary.BigEndian.Uint64(b[8:16])
	var out [26]byte
	for i := 25; i >= 0; i-- {
		out[i] = crockford[lo&31]
		lo = lo>>5 | hi<<59
		hi >>= 5
	}
	return string(out[:])
}
