package media

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Config locates an S3-compatible bucket.
type S3Config struct {
	Endpoint  string // host:port, no scheme
	Bucket    string
	AccessKey string
	SecretKey string
	Region    string
	UseTLS    bool
}

// S3Store keeps objects in an S3-compatible bucket.
type S3Store struct {
	client *minio.Client
	bucket string
}

// NewS3Store builds the client; it does not contact the server (the first
// request does), so a relay starts while the store is briefly unreachable.
func NewS3Store(cfg S3Config) (*S3Store, error) {
	client, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:  credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure: cfg.UseTLS,
		Region: cfg.Region,
		// Path-style addressing works with every S3-compatible server;
		// virtual-host style needs DNS for each bucket.
		BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		return nil, fmt.Errorf("media S3 endpoint %q: %w", cfg.Endpoint, err)
	}
	return &S3Store{client: client, bucket: cfg.Bucket}, nil
}

// Check asks the server whether the bucket exists: a missing bucket and a
// missing key both answer 404 to an object request, so probing a key would
// call a wrongly named bucket ready.
func (s *S3Store) Check(ctx context.Context) error {
	exists, err := s.client.BucketExists(ctx, s.bucket)
	if err != nil {
		return fmt.Errorf("media S3 bucket %q: %w", s.bucket, err)
	}
	if !exists {
		return fmt.Errorf("media S3 bucket %q does not exist", s.bucket)
	}
	return nil
}

func notFound(err error) bool {
	resp := minio.ToErrorResponse(err)
	return resp.StatusCode == http.StatusNotFound || resp.Code == "NoSuchKey"
}

// Put uploads the object; S3 makes it visible only when complete. The
// payload is not streamed with chunk signatures (aws-chunked): the relay
// hashed the bytes itself before they reach the store, and servers differ
// in which requests they accept that encoding on (some take it on a single
// PUT but store the chunk framing of multipart parts as data).
func (s *S3Store) Put(ctx context.Context, key string, body io.Reader, size int64, contentType string) error {
	_, err := s.client.PutObject(ctx, s.bucket, key, body, size, minio.PutObjectOptions{
		ContentType:          contentType,
		DisableContentSha256: true,
	})
	return err
}

// Open stats the object, then returns a lazy reader that fetches it in
// bounded ranged GETs (see s3Object).
func (s *S3Store) Open(ctx context.Context, key string) (Object, Info, error) {
	info, err := s.Stat(ctx, key)
	if err != nil {
		return nil, Info{}, err
	}
	return &s3Object{ctx: ctx, core: minio.Core{Client: s.client}, bucket: s.bucket, key: key, size: info.Size}, info, nil
}

// The first GET after a seek asks for what the read wants, at least
// s3FirstWindow bytes; each further GET of a sequential read asks for four
// times more, up to s3MaxWindow.
const (
	s3FirstWindow = 32 << 10
	s3MaxWindow   = 16 << 20
)

// s3Object reads an object through ranged GETs of growing size. A GET
// left open to the end of the object (minio's reader) makes the server
// push as much as the socket takes, megabytes, before the reader hangs up:
// an anonymous request for one byte of a large blob cost the store that
// much egress. Here a read fetches at most four times what was read
// before it (at least s3FirstWindow), so a ranged or abandoned download
// costs about what it served, and a whole one a handful of GETs.
type s3Object struct {
	ctx    context.Context
	core   minio.Core
	bucket string
	key    string
	size   int64

	pos    int64         // the next byte Read returns
	body   io.ReadCloser // the open GET, serving [pos, end)
	end    int64
	window int64 // the size of the next GET; 0 after a seek
}

func (o *s3Object) Read(p []byte) (int, error) {
	if o.pos >= o.size {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	if o.body == nil || o.pos >= o.end {
		if err := o.fetch(int64(len(p))); err != nil {
			return 0, err
		}
	}
	if int64(len(p)) > o.end-o.pos {
		p = p[:o.end-o.pos]
	}
	n, err := o.body.Read(p)
	o.pos += int64(n)
	if err == io.EOF {
		err = nil
		if o.pos < o.end {
			err = io.ErrUnexpectedEOF
		}
	}
	return n, err
}

// fetch opens the next GET at pos, for at least want bytes.
func (o *s3Object) fetch(want int64) error {
	o.closeBody()
	n := max(o.window, want, s3FirstWindow)
	o.window = min(4*n, s3MaxWindow)
	end := min(o.pos+n, o.size)
	opts := minio.GetObjectOptions{}
	if err := opts.SetRange(o.pos, end-1); err != nil {
		return err
	}
	body, _, _, err := o.core.GetObject(o.ctx, o.bucket, o.key, opts)
	if err != nil {
		if notFound(err) {
			return ErrNotFound
		}
		return err
	}
	o.body, o.end = body, end
	return nil
}

func (o *s3Object) Seek(offset int64, whence int) (int64, error) {
	pos := offset
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		pos += o.pos
	case io.SeekEnd:
		pos += o.size
	default:
		return o.pos, fmt.Errorf("media: seek whence %d", whence)
	}
	if pos < 0 {
		return o.pos, fmt.Errorf("media: seek to %d, before the start", pos)
	}
	if pos != o.pos {
		o.closeBody()
		o.pos, o.window = pos, 0
	}
	return pos, nil
}

func (o *s3Object) closeBody() {
	if o.body != nil {
		o.body.Close()
		o.body = nil
	}
}

func (o *s3Object) Close() error {
	o.closeBody()
	return nil
}

// Stat heads the object.
func (s *S3Store) Stat(ctx context.Context, key string) (Info, error) {
	st, err := s.client.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{})
	if err != nil {
		if notFound(err) {
			return Info{}, ErrNotFound
		}
		return Info{}, err
	}
	return Info{Size: st.Size, ModTime: st.LastModified}, nil
}

// Delete removes the object; S3 answers success for an absent key.
func (s *S3Store) Delete(ctx context.Context, key string) error {
	err := s.client.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{})
	if err != nil && notFound(err) {
		return nil
	}
	return err
}

// List pages through every key under prefix.
func (s *S3Store) List(ctx context.Context, prefix string) ([]string, error) {
	var keys []string
	for obj := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if obj.Err != nil {
			return nil, obj.Err
		}
		keys = append(keys, obj.Key)
	}
	return keys, nil
}

// Walk pages through the listing (S3 returns keys in ascending byte order,
// a thousand per page), so memory holds one page whatever the prefix
// holds; the first page starts after after (ListObjectsV2's start-after).
func (s *S3Store) Walk(ctx context.Context, prefix, after string, fn func(key string, size int64) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the lister when fn fails
	for obj := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: prefix, StartAfter: after, Recursive: true}) {
		if obj.Err != nil {
			return obj.Err
		}
		if err := fn(obj.Key, obj.Size); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// DeleteKeys uses multi-object delete (up to a thousand keys a request).
// S3 answers success for an absent key, so every key counts as deleted.
func (s *S3Store) DeleteKeys(ctx context.Context, keys []string) (deleted, missing int, err error) {
	objects := make(chan minio.ObjectInfo, len(keys))
	for _, key := range keys {
		objects <- minio.ObjectInfo{Key: key}
	}
	close(objects)
	var failed []string
	for res := range s.client.RemoveObjects(ctx, s.bucket, objects, minio.RemoveObjectsOptions{}) {
		if res.Err != nil && !notFound(res.Err) {
			failed = append(failed, res.ObjectName+": "+res.Err.Error())
		}
	}
	if len(failed) > 0 {
		return 0, 0, fmt.Errorf("media: %d of %d keys not deleted, first: %s", len(failed), len(keys), failed[0])
	}
	return len(keys), 0, ctx.Err()
}

// PruneEmpty has nothing to do: a bucket has no directories, only keys.
func (s *S3Store) PruneEmpty(context.Context, string) error { return nil }

// Children lists the common prefixes one level under prefix.
func (s *S3Store) Children(ctx context.Context, prefix string) ([]string, error) {
	var names []string
	for obj := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: false}) {
		if obj.Err != nil {
			return nil, obj.Err
		}
		if name, ok := strings.CutSuffix(strings.TrimPrefix(obj.Key, prefix), "/"); ok && name != "" {
			names = append(names, name)
		}
	}
	return names, nil
}
