package relay_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/media/s3test"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// mediaStores are the stores every media acceptance test runs on: files
// in a temporary directory, and a real S3-protocol server on loopback.
var mediaStores = map[string]func(t testing.TB) media.Store{
	"fs": func(t testing.TB) media.Store {
		s, err := media.NewFSStore(t.TempDir())
		require.NoError(t, err)
		return s
	},
	"s3": func(t testing.TB) media.Store { return s3test.Store(t) },
}

// testMediaMaxBytes keeps the oversize tests small.
const testMediaMaxBytes = 64 << 10

// mediaRelay is a relay serving media from store.
func mediaRelay(t *testing.T, store media.Store) *relaytest.Relay {
	t.Helper()
	svc := media.NewService(store, media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
	return relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithMedia(svc)})
}

// pngBlob is a distinct PNG-sniffed blob of n bytes.
func pngBlob(t *testing.T, n int) []byte {
	t.Helper()
	b := append([]byte("\x89PNG\r\n\x1a\n"), []byte(uuid.NewString())...)
	for len(b) < n {
		b = append(b, byte(len(b)*7))
	}
	return b[:n]
}

func hexSHA(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// blossomAuth is a Blossom kind 24242 Authorization header for action,
// valid for a minute unless mutate changes it.
func blossomAuth(t *testing.T, key *nostr.SecretKey, action string, hashes []string, mutate func(*nostr.Event)) string {
	t.Helper()
	tags := nostr.Tags{{"t", action}, {"expiration", strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)}}
	for _, h := range hashes {
		tags = append(tags, nostr.Tag{"x", h})
	}
	ev := &nostr.Event{Kind: 24242, CreatedAt: time.Now().Unix(), Content: action + " blob", Tags: tags}
	if mutate != nil {
		mutate(ev)
	}
	require.NoError(t, ev.Sign(key))
	return authHeader(ev)
}

type mediaReply struct {
	Status int
	Header http.Header
	Body   []byte
	Error  string `json:"error"`
	URL    string `json:"url"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	Type   string `json:"type"`
}

// mediaDo sends one media request to host ("" = the home community).
func mediaDo(t *testing.T, r *relaytest.Relay, method, host, path, authorization string, body io.Reader, header map[string]string) mediaReply {
	t.Helper()
	req, err := http.NewRequest(method, r.HTTPURL+path, body)
	require.NoError(t, err)
	if host != "" {
		req.Host = host
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := bridgeHTTP.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	out := mediaReply{Status: resp.StatusCode, Header: resp.Header, Body: raw}
	if resp.Header.Get("Content-Type") == "application/json" && len(raw) > 0 {
		require.NoError(t, json.Unmarshal(raw, &out), "%s", raw)
	}
	return out
}

func upload(t *testing.T, r *relaytest.Relay, host string, key *nostr.SecretKey, blob []byte) mediaReply {
	t.Helper()
	return mediaDo(t, r, http.MethodPut, host, "/media/upload", blossomAuth(t, key, "upload", []string{hexSHA(blob)}, nil), bytes.NewReader(blob), nil)
}

func storeKeys(t *testing.T, s media.Store) []string {
	t.Helper()
	keys, err := s.List(context.Background(), "")
	require.NoError(t, err)
	slices.Sort(keys)
	return keys
}

// Upload, GET (whole, with an extension, ranged, conditional), HEAD and
// delete through the relay on both stores; afterwards nothing of the blob
// is left.
// Mutations killed: GET without Range support (206 expected); a wrong or
// missing Content-Type, Content-Length or ETag; HEAD sending a body;
// delete leaving the blob, the sidecar or the upload record behind.
func TestMediaRoundTrip(t *testing.T) {
	t.Parallel()
	for name, newStore := range mediaStores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store := newStore(t)
			r := mediaRelay(t, store)
			key := relaytest.NewKey(t)
			blob := pngBlob(t, 10_000)
			sha := hexSHA(blob)

			up := upload(t, r, "", key, blob)
			require.Equal(t, http.StatusOK, up.Status, "%s", up.Body)
			require.Equal(t, sha, up.SHA256)
			require.EqualValues(t, len(blob), up.Size)
			require.Equal(t, "image/png", up.Type)
			require.Equal(t, r.HTTPURL+"/media/"+sha+".png", up.URL)

			for _, path := range []string{"/media/" + sha, "/media/" + sha + ".png", "/media/" + sha + ".jpg"} {
				got := mediaDo(t, r, http.MethodGet, "", path, "", nil, nil)
				require.Equal(t, http.StatusOK, got.Status, path)
				require.Equal(t, blob, got.Body, path)
				require.Equal(t, "image/png", got.Header.Get("Content-Type"), path)
				require.Equal(t, strconv.Itoa(len(blob)), got.Header.Get("Content-Length"), path)
				require.Equal(t, `"`+sha+`"`, got.Header.Get("ETag"), path)
			}

			head := mediaDo(t, r, http.MethodHead, "", "/media/"+sha, "", nil, nil)
			require.Equal(t, http.StatusOK, head.Status)
			require.Empty(t, head.Body)
			require.Equal(t, strconv.Itoa(len(blob)), head.Header.Get("Content-Length"))
			require.Equal(t, "image/png", head.Header.Get("Content-Type"))

			ranged := mediaDo(t, r, http.MethodGet, "", "/media/"+sha, "", nil, map[string]string{"Range": "bytes=1000-1999"})
			require.Equal(t, http.StatusPartialContent, ranged.Status)
			require.Equal(t, blob[1000:2000], ranged.Body)
			require.Equal(t, fmt.Sprintf("bytes 1000-1999/%d", len(blob)), ranged.Header.Get("Content-Range"))
			// Several ranges would cost a store read each (a GET each on S3):
			// the whole blob, read once, instead.
			// Mutation killed: serving multi-range requests (206 multipart).
			multi := mediaDo(t, r, http.MethodGet, "", "/media/"+sha, "", nil, map[string]string{"Range": "bytes=0-0,20-20,40-40"})
			require.Equal(t, http.StatusOK, multi.Status)
			require.Equal(t, blob, multi.Body)

			cached := mediaDo(t, r, http.MethodGet, "", "/media/"+sha, "", nil, map[string]string{"If-None-Match": `"` + sha + `"`})
			require.Equal(t, http.StatusNotModified, cached.Status)

			del := mediaDo(t, r, http.MethodDelete, "", "/media/"+sha, blossomAuth(t, key, "delete", []string{sha}, nil), nil, nil)
			require.Equal(t, http.StatusOK, del.Status, "%s", del.Body)
			gone := mediaDo(t, r, http.MethodGet, "", "/media/"+sha, "", nil, nil)
			require.Equal(t, http.StatusNotFound, gone.Status)
			require.Contains(t, gone.Error, "not found")
			require.Equal(t, []string{sha + ".png"}, storeKeys(t, store), "sidecar and upload record are gone; the blob is the sweep's")
		})
	}
}

// The same bytes uploaded in two communities are one blob with two
// sidecars and two upload records; deleting in one community keeps the
// blob for the other, and the last delete removes it.
// Mutations killed: blob keys per community (two blobs); sidecars or
// upload records outside _meta/<community>/ and _uploads/<community>/;
// delete removing the blob while another community references it; delete
// leaving an unreferenced blob.
func TestMediaSharedBlobAcrossCommunities(t *testing.T) {
	t.Parallel()
	for name, newStore := range mediaStores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store := newStore(t)
			r := mediaRelay(t, store)
			otherHost := "other.example"
			other := r.AddCommunity(t, otherHost)
			alice, bob := relaytest.NewKey(t), relaytest.NewKey(t)
			blob := pngBlob(t, 3000)
			sha := hexSHA(blob)

			require.Equal(t, http.StatusOK, upload(t, r, "", alice, blob).Status)
			require.Equal(t, http.StatusOK, upload(t, r, otherHost, bob, blob).Status)

			keys := storeKeys(t, store)
			require.Len(t, keys, 5, "%v", keys)
			require.Equal(t, sha+".png", pick(keys, sha), "one shared blob")
			require.Equal(t, "_meta/"+r.CommunityID.String()+"/"+sha+".json", pick(keys, "_meta/"+r.CommunityID.String()+"/"))
			require.Equal(t, "_meta/"+other.String()+"/"+sha+".json", pick(keys, "_meta/"+other.String()+"/"))
			require.Regexp(t, `^_uploads/`+r.CommunityID.String()+`/`+sha+`/[0-9A-HJKMNP-TV-Z]{26}\.json$`, pick(keys, "_uploads/"+r.CommunityID.String()+"/"))
			require.Regexp(t, `^_uploads/`+other.String()+`/`+sha+`/[0-9A-HJKMNP-TV-Z]{26}\.json$`, pick(keys, "_uploads/"+other.String()+"/"))

			del := mediaDo(t, r, http.MethodDelete, "", "/media/"+sha, blossomAuth(t, alice, "delete", []string{sha}, nil), nil, nil)
			require.Equal(t, http.StatusOK, del.Status, "%s", del.Body)
			require.Equal(t, http.StatusNotFound, mediaDo(t, r, http.MethodGet, "", "/media/"+sha, "", nil, nil).Status)
			still := mediaDo(t, r, http.MethodGet, otherHost, "/media/"+sha, "", nil, nil)
			require.Equal(t, http.StatusOK, still.Status)
			require.Equal(t, blob, still.Body)

			del = mediaDo(t, r, http.MethodDelete, otherHost, "/media/"+sha, blossomAuth(t, bob, "delete", []string{sha}, nil), nil, nil)
			require.Equal(t, http.StatusOK, del.Status, "%s", del.Body)
			require.Len(t, storeKeys(t, store), 1, "only the blob, which is the sweep's")
		})
	}
}

// pick is the one key with prefix.
func pick(keys []string, prefix string) string {
	var found []string
	for _, k := range keys {
		if len(k) >= len(prefix) && k[:len(prefix)] == prefix {
			found = append(found, k)
		}
	}
	if len(found) != 1 {
		return fmt.Sprintf("%d keys under %s: %v", len(found), prefix, found)
	}
	return found[0]
}

// Every refused upload answers a clear status and JSON reason behind a
// NIP-01 prefix and stores nothing.
// Mutations killed (one per case): no size check (413); the size checked
// only from Content-Length (chunked 413); no type allow-list (415); the x
// tag, X-SHA-256 or NIP-98 payload not compared with the body's hash
// (400); an empty body stored as a blob (400); expiration not checked or
// read with a sign (strconv.ParseInt), the t tag not checked, the signature not
// verified, a missing header accepted (401); a 401 reason without its
// auth-required: prefix.
func TestMediaUploadRefusals(t *testing.T) {
	t.Parallel()
	for name, newStore := range mediaStores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store := newStore(t)
			r := mediaRelay(t, store)
			key, other := relaytest.NewKey(t), relaytest.NewKey(t)
			blob := pngBlob(t, 1000)
			sha := hexSHA(blob)
			big := pngBlob(t, testMediaMaxBytes+1)
			html := []byte("<!DOCTYPE html><html><script>alert(1)</script></html>")
			expired := func(ev *nostr.Event) {
				ev.Tags[1] = nostr.Tag{"expiration", strconv.FormatInt(time.Now().Add(-time.Second).Unix(), 10)}
			}
			noExpiration := func(ev *nostr.Event) { ev.Tags = ev.Tags[:1] }
			// Read as a NIP-40 expiration is: digits alone, no sign.
			signedExpiration := func(ev *nostr.Event) {
				ev.Tags[1] = nostr.Tag{"expiration", "+" + strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)}
			}
			payloadOf := func(b []byte) func(*nostr.Event) {
				return func(ev *nostr.Event) { ev.Tags[2] = nostr.Tag{"payload", hexSHA(b)} }
			}
			wrongSigner := func() string {
				ev := &nostr.Event{Kind: 24242, CreatedAt: time.Now().Unix(), Tags: nostr.Tags{{"t", "upload"}, {"expiration", strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)}}}
				require.NoError(t, ev.Sign(key))
				ev.PubKey = other.PublicKeyHex()
				id := ev.ComputeID()
				ev.ID = hex.EncodeToString(id[:])
				return authHeader(ev)
			}()
			for _, c := range []struct {
				name   string
				auth   string
				body   io.Reader
				header map[string]string
				status int
				reason string
			}{
				{"oversize", blossomAuth(t, key, "upload", nil, nil), bytes.NewReader(big), nil, http.StatusRequestEntityTooLarge, "blob too large"},
				{"oversize chunked", blossomAuth(t, key, "upload", nil, nil), io.MultiReader(bytes.NewReader(big)), nil, http.StatusRequestEntityTooLarge, "blob too large"},
				{"type not allowed", blossomAuth(t, key, "upload", nil, nil), bytes.NewReader(html), nil, http.StatusUnsupportedMediaType, "media type not allowed: the content is text/html"},
				{"x tag names another hash", blossomAuth(t, key, "upload", []string{hexSHA(html)}, nil), bytes.NewReader(blob), nil, http.StatusBadRequest, "blob hash mismatch"},
				{"X-SHA-256 names another hash", blossomAuth(t, key, "upload", nil, nil), bytes.NewReader(blob), map[string]string{"X-SHA-256": hexSHA(html)}, http.StatusBadRequest, "X-SHA-256 names"},
				{"NIP-98 payload names another hash", authHeader(nip98(t, key, "PUT", r.HTTPURL+"/media/upload", nil, payloadOf(html))), bytes.NewReader(blob), nil, http.StatusBadRequest, "payload tag names"},
				{"expired", blossomAuth(t, key, "upload", []string{sha}, expired), bytes.NewReader(blob), nil, http.StatusUnauthorized, "auth event expired"},
				{"no expiration", blossomAuth(t, key, "upload", []string{sha}, noExpiration), bytes.NewReader(blob), nil, http.StatusUnauthorized, "no expiration tag"},
				{"signed expiration", blossomAuth(t, key, "upload", []string{sha}, signedExpiration), bytes.NewReader(blob), nil, http.StatusUnauthorized, "expiration is not a unix time"},
				{"wrong t", blossomAuth(t, key, "delete", []string{sha}, nil), bytes.NewReader(blob), nil, http.StatusUnauthorized, `t tag must be "upload"`},
				{"wrong signer", wrongSigner, bytes.NewReader(blob), nil, http.StatusUnauthorized, "signature"},
				{"other server", blossomAuth(t, key, "upload", []string{sha}, func(ev *nostr.Event) { ev.Tags = append(ev.Tags, nostr.Tag{"server", "cdn.example"}) }), bytes.NewReader(blob), nil, http.StatusUnauthorized, "server tags"},
				{"no auth", "", bytes.NewReader(blob), nil, http.StatusUnauthorized, "missing Authorization"},
				{"empty", blossomAuth(t, key, "upload", nil, nil), bytes.NewReader(nil), nil, http.StatusBadRequest, "empty blob"},
			} {
				got := mediaDo(t, r, http.MethodPut, "", "/media/upload", c.auth, c.body, c.header)
				require.Equal(t, c.status, got.Status, "%s: %s", c.name, got.Body)
				require.Contains(t, got.Error, c.reason, c.name)
				requireNIP01Prefix(t, got.Error, c.name)
				require.Equal(t, got.Error, got.Header.Get("X-Reason"), c.name)
			}
			require.Empty(t, storeKeys(t, store), "no refused upload stored anything")
		})
	}
}

// A server tag, and a NIP-98 u URL, name one port of their host, as the
// relay tells communities apart: without a port (or with its scheme's
// default) the default port only, so a token signed for relay.example does
// not upload to the community at relay.example:8443, nor one signed for
// :8443 to relay.example.
// Mutations killed: a server tag without a port matched against the
// request's host with its port dropped (the :8443 uploads pass); the URL
// tag's port dropped (https://...:8443 is refused at :8443); a default port
// counted whatever the URL's scheme (https://...:80 and, in a u tag,
// http://...:443 pass).
func TestMediaAuthNamesOnePort(t *testing.T) {
	t.Parallel()
	r := mediaRelay(t, mediaStores["fs"](t))
	const plain, other = "ports.example", "ports.example:8443"
	r.AddCommunity(t, plain)
	r.AddCommunity(t, other)
	key := relaytest.NewKey(t)
	for _, c := range []struct {
		server, u, host string
		ok              bool
	}{
		{"ports.example", "", plain, true},
		{"ports.example", "", "ports.example:443", true},
		{"ports.example", "", other, false},
		{"https://ports.example", "", plain, true},
		{"https://ports.example/", "", other, false},
		{"http://ports.example", "", other, false},
		{"https://ports.example:443", "", plain, true},
		{"http://ports.example:80", "", plain, true},
		{"https://ports.example:80", "", plain, false},
		{"http://ports.example:443", "", plain, false},
		{"https://ports.example:8443", "", other, true},
		{"https://ports.example:8443", "", plain, false},
		{"ports.example:8443", "", other, true},
		{"ports.example:8443", "", plain, false},
		// The test relay serves http, so its request URL is http://<Host>.
		{"", "http://ports.example/media/upload", plain, true},
		{"", "http://ports.example:80/media/upload", plain, true},
		{"", "http://ports.example/media/upload", other, false},
		{"", "http://ports.example:8443/media/upload", other, true},
		{"", "http://ports.example:8443/media/upload", plain, false},
		{"", "http://ports.example:443/media/upload", plain, false},
	} {
		blob := pngBlob(t, 500)
		var auth, refusal string
		if c.u != "" {
			auth, refusal = authHeader(nip98(t, key, http.MethodPut, c.u, blob, nil)), "auth-required: u tag does not match this URL"
		} else {
			auth = blossomAuth(t, key, "upload", []string{hexSHA(blob)}, func(ev *nostr.Event) {
				ev.Tags = append(ev.Tags, nostr.Tag{"server", c.server})
			})
			refusal = "auth-required: auth event server tags do not name this host"
		}
		got := mediaDo(t, r, http.MethodPut, c.host, "/media/upload", auth, bytes.NewReader(blob), nil)
		if c.ok {
			require.Equal(t, http.StatusOK, got.Status, "server %q, u %q, host %s: %s", c.server, c.u, c.host, got.Body)
			continue
		}
		require.Equal(t, http.StatusUnauthorized, got.Status, "server %q, u %q, host %s: %s", c.server, c.u, c.host, got.Body)
		require.Contains(t, got.Error, refusal)
	}
}

// Only an uploader deletes, and only in the community they uploaded to.
// Mutations killed: delete without checking the upload records (foreign
// delete succeeds); a Blossom delete token without an x tag for this hash
// accepted; a NIP-98 delete replayable.
func TestMediaForeignDeleteRefused(t *testing.T) {
	t.Parallel()
	store := mediaStores["fs"](t)
	r := mediaRelay(t, store)
	otherHost := "foreign.example"
	r.AddCommunity(t, otherHost)
	owner, stranger := relaytest.NewKey(t), relaytest.NewKey(t)
	blob := pngBlob(t, 2000)
	sha := hexSHA(blob)
	require.Equal(t, http.StatusOK, upload(t, r, "", owner, blob).Status)

	got := mediaDo(t, r, http.MethodDelete, "", "/media/"+sha, blossomAuth(t, stranger, "delete", []string{sha}, nil), nil, nil)
	require.Equal(t, http.StatusForbidden, got.Status, "%s", got.Body)
	require.Contains(t, got.Error, "restricted: not the uploader")

	got = mediaDo(t, r, http.MethodDelete, otherHost, "/media/"+sha, blossomAuth(t, owner, "delete", []string{sha}, nil), nil, nil)
	require.Equal(t, http.StatusNotFound, got.Status, "another community has no such blob: %s", got.Body)

	got = mediaDo(t, r, http.MethodDelete, "", "/media/"+sha, blossomAuth(t, owner, "delete", []string{hexSHA([]byte("x"))}, nil), nil, nil)
	require.Equal(t, http.StatusUnauthorized, got.Status, "%s", got.Body)
	require.Contains(t, got.Error, "no x tag naming")

	require.Equal(t, http.StatusOK, mediaDo(t, r, http.MethodGet, "", "/media/"+sha, "", nil, nil).Status, "refused deletes kept the blob")

	auth := authHeader(nip98(t, owner, "DELETE", r.HTTPURL+"/media/"+sha, nil, nil))
	got = mediaDo(t, r, http.MethodDelete, "", "/media/"+sha, auth, nil, nil)
	require.Equal(t, http.StatusOK, got.Status, "the uploader deletes with NIP-98: %s", got.Body)
	got = mediaDo(t, r, http.MethodDelete, "", "/media/"+sha, auth, nil, nil)
	require.Equal(t, http.StatusUnauthorized, got.Status, "%s", got.Body)
	require.Contains(t, got.Error, "already used")
}

// A NIP-98 upload signs the body's hash in its payload tag and cannot be
// replayed; a GET with a malformed name is 400, and a relay without media
// answers 404.
// Mutations killed: the NIP-98 claim skipped (replay stored twice);
// ParseBlobName bypassed (400 expected); routes served without a store.
func TestMediaNIP98UploadAndBadPaths(t *testing.T) {
	t.Parallel()
	r := mediaRelay(t, mediaStores["fs"](t))
	key := relaytest.NewKey(t)
	blob := pngBlob(t, 500)
	auth := authHeader(nip98(t, key, "PUT", r.HTTPURL+"/media/upload", blob, nil))
	got := mediaDo(t, r, http.MethodPut, "", "/media/upload", auth, bytes.NewReader(blob), nil)
	require.Equal(t, http.StatusOK, got.Status, "%s", got.Body)
	require.Equal(t, hexSHA(blob), got.SHA256)
	got = mediaDo(t, r, http.MethodPut, "", "/media/upload", auth, bytes.NewReader(blob), nil)
	require.Equal(t, http.StatusUnauthorized, got.Status, "%s", got.Body)
	require.Contains(t, got.Error, "already used")

	for _, path := range []string{"/media/abc", "/media/" + hexSHA(blob) + ".p/g", "/media/" + hexSHA(blob) + ".."} {
		got = mediaDo(t, r, http.MethodGet, "", path, "", nil, nil)
		require.Contains(t, []int{http.StatusBadRequest, http.StatusNotFound}, got.Status, path)
	}
	got = mediaDo(t, r, http.MethodGet, "", "/media/abc", "", nil, nil)
	require.Equal(t, http.StatusBadRequest, got.Status)
	require.Contains(t, got.Error, "64-digit hex hash")

	plain := relaytest.Start(t)
	req, err := http.NewRequest(http.MethodGet, plain.HTTPURL+"/media/"+hexSHA(blob), nil)
	require.NoError(t, err)
	resp, err := bridgeHTTP.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
}

// The upload preflight (HEAD /media/upload) answers what the upload would:
// 200 for an acceptable description, 413, 415 and 401 with X-Reason
// otherwise, before any byte is sent.
// Mutations killed: the route missing (HEAD falls to GET /media/{name}:
// 400); X-Content-Length or X-Content-Type not checked; auth not checked.
func TestMediaUploadPreflight(t *testing.T) {
	t.Parallel()
	r := mediaRelay(t, mediaStores["fs"](t))
	key := relaytest.NewKey(t)
	sha := hexSHA([]byte("anything"))
	for _, c := range []struct {
		name   string
		auth   string
		header map[string]string
		status int
		reason string
	}{
		{"acceptable", blossomAuth(t, key, "upload", []string{sha}, nil), map[string]string{"X-SHA-256": sha, "X-Content-Length": "1000", "X-Content-Type": "image/png"}, http.StatusOK, ""},
		{"too large", blossomAuth(t, key, "upload", nil, nil), map[string]string{"X-Content-Length": strconv.Itoa(testMediaMaxBytes + 1)}, http.StatusRequestEntityTooLarge, "blob too large"},
		{"type", blossomAuth(t, key, "upload", nil, nil), map[string]string{"X-Content-Type": "text/html"}, http.StatusUnsupportedMediaType, "media type not allowed: text/html"},
		{"other hash", blossomAuth(t, key, "upload", []string{sha}, nil), map[string]string{"X-SHA-256": hexSHA([]byte("else"))}, http.StatusUnauthorized, "x tags do not name"},
		{"no auth", "", nil, http.StatusUnauthorized, "missing Authorization"},
		// A NIP-98 header signs the upload it describes: the PUT, and its body.
		{"NIP-98", authHeader(nip98(t, key, "PUT", r.HTTPURL+"/media/upload", []byte("anything"), nil)), map[string]string{"X-SHA-256": sha}, http.StatusOK, ""},
		{"NIP-98 other hash", authHeader(nip98(t, key, "PUT", r.HTTPURL+"/media/upload", []byte("anything"), nil)), map[string]string{"X-SHA-256": hexSHA([]byte("else"))}, http.StatusUnauthorized, "payload tag does not name"},
		// The upload refuses an event without a payload tag whatever its
		// body, so the preflight must, with or without X-SHA-256.
		// Mutation killed: the payload tag looked at only when X-SHA-256
		// is sent (200, then the upload's 401).
		{"NIP-98 without payload", authHeader(nip98(t, key, "PUT", r.HTTPURL+"/media/upload", nil, withoutPayload)), map[string]string{"X-Content-Length": "1000"}, http.StatusUnauthorized, "no payload tag"},
	} {
		got := mediaDo(t, r, http.MethodHead, "", "/media/upload", c.auth, nil, c.header)
		require.Equal(t, c.status, got.Status, c.name)
		require.Contains(t, got.Header.Get("X-Reason"), c.reason, c.name)
	}
	// The preflight claims nothing: the header it approved still uploads.
	// Mutation killed: checking a NIP-98 preflight against HEAD (401).
	blob := pngBlob(t, 500)
	auth := authHeader(nip98(t, key, "PUT", r.HTTPURL+"/media/upload", blob, nil))
	got := mediaDo(t, r, http.MethodHead, "", "/media/upload", auth, nil, map[string]string{"X-SHA-256": hexSHA(blob)})
	require.Equal(t, http.StatusOK, got.Status, got.Header.Get("X-Reason"))
	got = mediaDo(t, r, http.MethodPut, "", "/media/upload", auth, bytes.NewReader(blob), nil)
	require.Equal(t, http.StatusOK, got.Status, "%s", got.Body)
}

// An upload whose body stops arriving is the client's failure, not the
// store's: 408 after BUZZ_HTTP_READ_TIMEOUT, not 500.
// Mutation killed: a body read failure answered as the store's (500).
func TestMediaSlowUploadBlamesTheBody(t *testing.T) {
	t.Parallel()
	svc := media.NewService(mediaStores["fs"](t), media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithMedia(svc)}, func(c *config.Config) { c.HTTPReadTimeout = time.Second })
	key := relaytest.NewKey(t)
	blob := pngBlob(t, 4000)
	body, send := io.Pipe()
	// The rest never comes: the relay must answer on its own read
	// timeout. (Sending it after a sleep past the timeout failed the test
	// when a loaded machine fired the relay's deadline late.)
	go func() { _, _ = send.Write(blob[:1000]) }()
	defer send.Close()
	req, err := http.NewRequest(http.MethodPut, r.HTTPURL+"/media/upload", body)
	require.NoError(t, err)
	req.ContentLength = int64(len(blob))
	req.Header.Set("Authorization", blossomAuth(t, key, "upload", []string{hexSHA(blob)}, nil))
	resp, err := bridgeHTTP.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusRequestTimeout, resp.StatusCode, resp.Header.Get("X-Reason"))
	require.Contains(t, resp.Header.Get("X-Reason"), "did not arrive within 1s")
}

// Every media request is counted by operation and status, with the bytes
// read and written; /ready names the media store's state and stays 200
// when the store is gone (events flow without media).
// Mutations killed: a route registered without countMedia (its counter
// stays absent); HEAD counted as get; bytes not counted; a store Check that
// probes an object key (a wrongly named bucket reads as ready).
func TestMediaMetricsAndReadiness(t *testing.T) {
	t.Parallel()
	r := mediaRelay(t, mediaStores["fs"](t))
	key := relaytest.NewKey(t)
	blob := pngBlob(t, 10_000)
	sha := hexSHA(blob)
	require.Equal(t, http.StatusOK, upload(t, r, "", key, blob).Status)
	require.Equal(t, http.StatusPartialContent, mediaDo(t, r, http.MethodGet, "", "/media/"+sha, "", nil, map[string]string{"Range": "bytes=0-999"}).Status)
	require.Equal(t, http.StatusOK, mediaDo(t, r, http.MethodHead, "", "/media/"+sha, "", nil, nil).Status)
	require.Equal(t, http.StatusNotFound, mediaDo(t, r, http.MethodGet, "", "/media/"+hexSHA([]byte("absent")), "", nil, nil).Status)
	require.Equal(t, http.StatusUnauthorized, mediaDo(t, r, http.MethodDelete, "", "/media/"+sha, "", nil, nil).Status)
	for series, want := range map[string]string{
		`buzz_media_requests_total{op="upload",status="200"}`: "1",
		`buzz_media_requests_total{op="get",status="206"}`:    "1",
		`buzz_media_requests_total{op="head",status="200"}`:   "1",
		`buzz_media_requests_total{op="get",status="404"}`:    "1",
		`buzz_media_requests_total{op="delete",status="401"}`: "1",
		`buzz_media_bytes_total{direction="in"}`:              "10000",
	} {
		require.Equal(t, want, metric(t, r, series), series)
	}
	out, err := strconv.Atoi(metric(t, r, `buzz_media_bytes_total{direction="out"}`))
	require.NoError(t, err)
	require.GreaterOrEqual(t, out, 1000, "the ranged body at least")
	require.Equal(t, "ok", readyField(t, r, "media"))

	s3 := s3test.Start(t)
	s3.Bucket = "no-such-bucket"
	missing, err := media.NewS3Store(s3)
	require.NoError(t, err)
	require.Equal(t, "unavailable", readyField(t, mediaRelay(t, missing), "media"))
	require.Equal(t, "ok", readyField(t, mediaRelay(t, s3test.Store(t)), "media"))
}

// smuggleKind is the Authorization header of ev with a second, differently
// cased "KIND" member: a case-insensitive JSON decoder reads that one, the
// event parser ignores it as an unknown field and keeps the signed kind.
func smuggleKind(t *testing.T, ev *nostr.Event, kind int) string {
	t.Helper()
	raw, err := ev.MarshalJSON()
	require.NoError(t, err)
	raw = append(raw[:len(raw)-1], []byte(`,"KIND":`+strconv.Itoa(kind)+`}`)...)
	return "Nostr " + base64.StdEncoding.EncodeToString(raw)
}

// A Blossom authorization is a kind 24242 event; any other signed event
// carrying the same tags authorizes nothing, however its JSON is spelled.
// Mutation killed: the Blossom branch trusting the kind it peeked at with
// a case-insensitive decoder instead of the parsed event's (a kind 1 note
// with t, x and expiration tags deleted its author's blob).
func TestMediaBlossomAuthMustBeKind24242(t *testing.T) {
	t.Parallel()
	store := mediaStores["fs"](t)
	r := mediaRelay(t, store)
	key := relaytest.NewKey(t)
	blob := pngBlob(t, 700)
	sha := hexSHA(blob)
	note := func(action string) *nostr.Event {
		ev := &nostr.Event{Kind: 1, CreatedAt: time.Now().Unix(), Content: "a note", Tags: nostr.Tags{
			{"t", action}, {"x", sha}, {"expiration", strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)}}}
		require.NoError(t, ev.Sign(key))
		return ev
	}

	got := mediaDo(t, r, http.MethodPut, "", "/media/upload", smuggleKind(t, note("upload"), 24242), bytes.NewReader(blob), nil)
	require.Equal(t, http.StatusUnauthorized, got.Status, "%s", got.Body)
	require.Contains(t, got.Error, "kind")
	require.Empty(t, storeKeys(t, store))

	require.Equal(t, http.StatusOK, upload(t, r, "", key, blob).Status)
	got = mediaDo(t, r, http.MethodDelete, "", "/media/"+sha, smuggleKind(t, note("delete"), 24242), nil, nil)
	require.Equal(t, http.StatusUnauthorized, got.Status, "%s", got.Body)
	require.Contains(t, got.Error, "kind")
	require.Equal(t, http.StatusOK, mediaDo(t, r, http.MethodGet, "", "/media/"+sha, "", nil, nil).Status, "the blob is still served")
}

// A delete is a write: it counts against its signer's publish rate limit
// like an upload, before it costs a replay claim, a serving-write lease
// (database rows) or store reads. A Blossom delete token is reusable until
// it expires, so without the limit one signed token drove unbounded
// database writes and store listings.
// Mutation killed: serveMediaDelete without the publish limiter (the
// fourth delete answers 403 instead of 429).
func TestMediaDeleteIsRateLimited(t *testing.T) {
	t.Parallel()
	svc := media.NewService(mediaStores["fs"](t), media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithMedia(svc)}, func(c *config.Config) { c.PublishPerMinute, c.PublishBurst = 1, 3 })
	owner, stranger := relaytest.NewKey(t), relaytest.NewKey(t)
	blob := pngBlob(t, 800)
	sha := hexSHA(blob)
	require.Equal(t, http.StatusOK, upload(t, r, "", owner, blob).Status)

	token := blossomAuth(t, stranger, "delete", []string{sha}, nil)
	for i := range 3 {
		got := mediaDo(t, r, http.MethodDelete, "", "/media/"+sha, token, nil, nil)
		require.Equal(t, http.StatusForbidden, got.Status, "delete %d: %s", i, got.Body)
	}
	got := mediaDo(t, r, http.MethodDelete, "", "/media/"+sha, token, nil, nil)
	require.Equal(t, http.StatusTooManyRequests, got.Status, "%s", got.Body)
	require.Contains(t, got.Error, "rate-limited")
	require.Equal(t, got.Error, got.Header.Get("X-Reason"))
	require.NotEmpty(t, got.Header.Get("Retry-After"))

	// The owner's own bucket is untouched by the stranger's refusals.
	got = mediaDo(t, r, http.MethodDelete, "", "/media/"+sha, blossomAuth(t, owner, "delete", []string{sha}, nil), nil, nil)
	require.Equal(t, http.StatusOK, got.Status, "%s", got.Body)
}

// A ranged GET reads from S3 about what it serves, not the rest of the
// blob: each anonymous request for one byte of a large blob used to open
// a GET streaming to the end of the object, and the S3 server pushed
// megabytes into the socket before the relay hung up (about 6 MB per
// one-byte request for a 16 MiB blob on loopback): cheap requests, costly
// egress. Whole and window-spanning reads still arrive intact.
// Mutation killed: S3Store.Open returning minio's open-ended object reader
// (hundreds of KiB to MiB per one-byte request instead of at most 32 KiB).
func TestMediaS3RangeReadsWhatItServes(t *testing.T) {
	t.Parallel()
	cfg, traffic := s3test.StartCounted(t)
	store, err := media.NewS3Store(cfg)
	require.NoError(t, err)
	svc := media.NewService(store, media.Limits{MaxBytes: 8 << 20, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithMedia(svc)})
	blob := pngBlob(t, 4<<20)
	sha := hexSHA(blob)
	require.Equal(t, http.StatusOK, upload(t, r, "", relaytest.NewKey(t), blob).Status)

	waitFor(t, traffic.Idle)
	traffic.BytesOut.Store(0)
	const requests = 10
	for i := range requests {
		at := 1000 + i*300_000
		got := mediaDo(t, r, http.MethodGet, "", "/media/"+sha, "", nil, map[string]string{"Range": fmt.Sprintf("bytes=%d-%d", at, at)})
		require.Equal(t, http.StatusPartialContent, got.Status)
		require.Equal(t, blob[at:at+1], got.Body)
	}
	waitFor(t, traffic.Idle) // an abandoned response counts in full
	perRequest := traffic.BytesOut.Load() / requests
	require.Less(t, perRequest, int64(40<<10), "S3 sent %d bytes per one-byte range (sidecar included)", perRequest)

	whole := mediaDo(t, r, http.MethodGet, "", "/media/"+sha, "", nil, nil)
	require.Equal(t, http.StatusOK, whole.Status)
	require.True(t, bytes.Equal(blob, whole.Body), "whole blob intact")
	span := mediaDo(t, r, http.MethodGet, "", "/media/"+sha, "", nil, map[string]string{"Range": "bytes=30000-3000000"})
	require.Equal(t, http.StatusPartialContent, span.Status)
	require.True(t, bytes.Equal(blob[30000:3000001], span.Body), "a range spanning reads intact")
}

// Blossom clients are mostly web apps on other origins: BUD-01 has every
// response carry Access-Control-Allow-Origin: * and a preflight allow the
// Authorization header and the four methods. Without them a browser
// refuses every upload and delete (the preflight fails) and hides every
// answer, refusal reasons included, from the page.
// Mutations killed: the preflight route missing (405 from the mux); the
// origin header missing from blobs or refusals; X-Reason not exposed.
func TestMediaCrossOrigin(t *testing.T) {
	t.Parallel()
	r := mediaRelay(t, mediaStores["fs"](t))
	blob := pngBlob(t, 600)
	sha := hexSHA(blob)
	require.Equal(t, http.StatusOK, upload(t, r, "", relaytest.NewKey(t), blob).Status)

	for _, path := range []string{"/media/upload", "/media/" + sha} {
		pre := mediaDo(t, r, http.MethodOptions, "", path, "", nil, map[string]string{
			"Origin": "https://client.example", "Access-Control-Request-Method": "PUT", "Access-Control-Request-Headers": "authorization,x-sha-256"})
		require.Equal(t, http.StatusNoContent, pre.Status, path)
		require.Equal(t, "*", pre.Header.Get("Access-Control-Allow-Origin"), path)
		require.Contains(t, pre.Header.Get("Access-Control-Allow-Headers"), "Authorization", path)
		for _, m := range []string{"GET", "HEAD", "PUT", "DELETE"} {
			require.Contains(t, pre.Header.Get("Access-Control-Allow-Methods"), m, path)
		}
	}
	origin := map[string]string{"Origin": "https://client.example"}
	for name, got := range map[string]mediaReply{
		"get":     mediaDo(t, r, http.MethodGet, "", "/media/"+sha, "", nil, origin),
		"missing": mediaDo(t, r, http.MethodGet, "", "/media/"+hexSHA([]byte("absent")), "", nil, origin),
		"refused": mediaDo(t, r, http.MethodPut, "", "/media/upload", "", bytes.NewReader(blob), origin),
	} {
		require.Equal(t, "*", got.Header.Get("Access-Control-Allow-Origin"), name)
		require.Contains(t, got.Header.Get("Access-Control-Expose-Headers"), "X-Reason", name)
	}
}

// The uploads a relay receives at once are bounded, per client address
// (429) and in all (503), so free keys cannot fill the spool directory in
// parallel; a finished upload gives its place back.
// Mutations killed: no admitUpload (the second upload from one address is
// taken); its release never called (the address's next upload, after both
// finished, is refused).
func TestMediaUploadsAtOnceAreBounded(t *testing.T) {
	t.Parallel()
	spool := t.TempDir()
	svc := media.NewService(mediaStores["fs"](t), media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: spool}, nil)
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithMedia(svc)}, func(c *config.Config) {
		c.MediaMaxUploads, c.MediaMaxUploadsPerAddr = 2, 1
		c.TrustedProxies = mustPrefixes(t, "127.0.0.0/8,::1") // the test names each client's address
	})
	key := relaytest.NewKey(t)
	uploadFrom := func(addr string) mediaReply {
		blob := pngBlob(t, 800)
		return mediaDo(t, r, http.MethodPut, "", "/media/upload", blossomAuth(t, key, "upload", []string{hexSHA(blob)}, nil),
			bytes.NewReader(blob), map[string]string{"X-Forwarded-For": addr})
	}
	// receiving counts the uploads that took their place. Their spool
	// files cannot tell: each is unlinked as soon as it is made.
	receiving := r.Server.UploadsReceiving
	// hold starts an upload from addr whose body stops halfway until finish.
	hold := func(addr string) (finish func() int) {
		blob := pngBlob(t, 4000)
		body, send := io.Pipe()
		req, err := http.NewRequest(http.MethodPut, r.HTTPURL+"/media/upload", body)
		require.NoError(t, err)
		req.ContentLength = int64(len(blob))
		req.Header.Set("Authorization", blossomAuth(t, key, "upload", []string{hexSHA(blob)}, nil))
		req.Header.Set("X-Forwarded-For", addr)
		status := make(chan int, 1)
		go func() {
			resp, err := bridgeHTTP.Do(req)
			if err != nil {
				status <- 0
				return
			}
			resp.Body.Close()
			status <- resp.StatusCode
		}()
		_, err = send.Write(blob[:2000])
		require.NoError(t, err)
		return func() int {
			_, err := send.Write(blob[2000:])
			require.NoError(t, err)
			require.NoError(t, send.Close())
			return <-status
		}
	}

	first := hold("203.0.113.1")
	require.Eventually(t, func() bool { return receiving() == 1 }, time.Minute, 10*time.Millisecond)
	got := uploadFrom("203.0.113.1")
	require.Equal(t, http.StatusTooManyRequests, got.Status, "%s", got.Body)
	require.Equal(t, "rate-limited: at most 1 uploads at once per client address; wait for one to finish", got.Error)
	require.NotEmpty(t, got.Header.Get("Retry-After"))

	second := hold("203.0.113.2")
	require.Eventually(t, func() bool { return receiving() == 2 }, time.Minute, 10*time.Millisecond)
	got = uploadFrom("203.0.113.3")
	require.Equal(t, http.StatusServiceUnavailable, got.Status, "%s", got.Body)
	require.Equal(t, "error: the relay is receiving its limit of 2 uploads; try again shortly", got.Error)

	require.Equal(t, http.StatusOK, first())
	require.Equal(t, http.StatusOK, second())
	got = uploadFrom("203.0.113.1")
	require.Equal(t, http.StatusOK, got.Status, "%s", got.Body)
	left, err := os.ReadDir(spool)
	require.NoError(t, err)
	require.Empty(t, left, "no spooled upload left behind")
}
