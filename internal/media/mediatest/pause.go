// Package mediatest holds media.Store wrappers for tests that need another
// relay process to act at a chosen moment.
package mediatest

import (
	"context"
	"io"
	"strings"
	"sync/atomic"

	"github.com/buzzrelay/buzz/internal/media"
)

// PauseAfterStatOrPut is a Store that stops its caller once, right after
// the n-th Stat or Put of key answered: the caller has seen whether the
// object is there, or has just written it, and not yet acted on it. An
// upload of a blob new to its community writes it without looking first,
// so its first call is a Put. Paused is closed then; the caller goes on
// once Resume is closed.
type PauseAfterStatOrPut struct {
	media.Store
	key    string
	n      int32
	calls  atomic.Int32
	Paused chan struct{}
	Resume chan struct{}
}

// NewPauseAfterStatOrPut wraps store.
func NewPauseAfterStatOrPut(store media.Store, key string, n int32) *PauseAfterStatOrPut {
	return &PauseAfterStatOrPut{Store: store, key: key, n: n, Paused: make(chan struct{}), Resume: make(chan struct{})}
}

func (p *PauseAfterStatOrPut) pauseAt(key string) {
	if key == p.key && p.calls.Add(1) == p.n {
		close(p.Paused)
		<-p.Resume
	}
}

func (p *PauseAfterStatOrPut) Stat(ctx context.Context, key string) (media.Info, error) {
	info, err := p.Store.Stat(ctx, key)
	p.pauseAt(key)
	return info, err
}

func (p *PauseAfterStatOrPut) Put(ctx context.Context, key string, body io.Reader, size int64, contentType string) error {
	err := p.Store.Put(ctx, key, body, size, contentType)
	p.pauseAt(key)
	return err
}

// PutUntilCanceled is a Store whose first Put of a key starting with key waits, once it began, until
// the caller's context ends, then writes anyway (as a file or an upload
// already handed to the store would): the client went away while its blob
// was being stored. Entered is closed when that Put begins. With
// ReportCancel the Put then answers the cancellation all the same, as an
// S3 PUT the store completed but whose response the caller no longer read.
type PutUntilCanceled struct {
	media.Store
	key          string
	once         atomic.Bool
	Entered      chan struct{}
	ReportCancel bool
}

// NewPutUntilCanceled wraps store.
func NewPutUntilCanceled(store media.Store, key string) *PutUntilCanceled {
	return &PutUntilCanceled{Store: store, key: key, Entered: make(chan struct{})}
}

func (p *PutUntilCanceled) Put(ctx context.Context, key string, body io.Reader, size int64, contentType string) error {
	if strings.HasPrefix(key, p.key) && p.once.CompareAndSwap(false, true) {
		close(p.Entered)
		<-ctx.Done()
		err := p.Store.Put(context.WithoutCancel(ctx), key, body, size, contentType)
		if err == nil && p.ReportCancel {
			err = ctx.Err()
		}
		return err
	}
	return p.Store.Put(ctx, key, body, size, contentType)
}

// PauseBeforePut is a Store that stops its caller once, before the first
// Put of a key under prefix. Paused is closed then; the Put goes on once
// Resume is closed.
type PauseBeforePut struct {
	media.Store
	prefix string
	once   atomic.Bool
	Paused chan struct{}
	Resume chan struct{}
}

// NewPauseBeforePut wraps store.
func NewPauseBeforePut(store media.Store, prefix string) *PauseBeforePut {
	return &PauseBeforePut{Store: store, prefix: prefix, Paused: make(chan struct{}), Resume: make(chan struct{})}
}

func (p *PauseBeforePut) Put(ctx context.Context, key string, body io.Reader, size int64, contentType string) error {
	if strings.HasPrefix(key, p.prefix) && p.once.CompareAndSwap(false, true) {
		close(p.Paused)
		<-p.Resume
	}
	return p.Store.Put(ctx, key, body, size, contentType)
}

// HoldDelete is a Store whose Delete of a key not starting with "_" (a
// blob, not a sidecar or an upload record) waits until Release is closed,
// or gives up with the caller's context, deleting nothing, and sends
// GaveUp why. Entered receives once as each such Delete begins.
type HoldDelete struct {
	media.Store
	Entered chan struct{}
	Release chan struct{}
	GaveUp  chan error
}

// NewHoldDelete wraps store; Entered holds up to buffer signals.
func NewHoldDelete(store media.Store, buffer int) *HoldDelete {
	return &HoldDelete{Store: store, Entered: make(chan struct{}, buffer), Release: make(chan struct{}), GaveUp: make(chan error, buffer)}
}

func (h *HoldDelete) Delete(ctx context.Context, key string) error {
	if !strings.HasPrefix(key, "_") {
		h.Entered <- struct{}{}
		select {
		case <-h.Release:
		case <-ctx.Done():
			h.GaveUp <- ctx.Err()
			return ctx.Err()
		}
	}
	return h.Store.Delete(ctx, key)
}
