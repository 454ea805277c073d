package relay

import (
	"bytes"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// Messages handled one after another run on one kept goroutine, which grew
// its stack once, rather than on a new goroutine each.
// Mutation killed: run always starting a goroutine (started counts 20).
func TestMessageHandlersAreKeptBetweenMessages(t *testing.T) {
	t.Parallel()
	h := newHandlers(4)
	for range 20 {
		// The goroutine that ran the previous message waits for the next
		// one once it counts itself idle.
		require.Eventually(t, func() bool { return h.started.Load() == 0 || h.idle.Load() == 1 }, 30*time.Second, time.Millisecond)
		done := make(chan struct{})
		h.run(func() { close(done) })
		<-done
	}
	require.EqualValues(t, 1, h.started.Load())
}

// However many messages were handled at once, at most maxIdle goroutines
// stay to wait for more; the others end.
// Mutation killed: loop waiting for work without the maxIdle bound (five
// goroutines stay).
func TestIdleMessageHandlersAreBounded(t *testing.T) {
	t.Parallel()
	h := newHandlers(2)
	gate := make(chan struct{})
	var ran sync.WaitGroup
	for range 5 {
		ran.Add(1)
		h.run(func() { <-gate; ran.Done() })
	}
	require.EqualValues(t, 5, h.started.Load(), "no goroutine was idle: each message started one")
	close(gate)
	ran.Wait()
	require.Eventually(t, func() bool { return h.live.Load() == 2 }, 30*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return h.idle.Load() == 2 }, 30*time.Second, time.Millisecond)
	// The kept ones take the next messages.
	done := make(chan struct{})
	h.run(func() { close(done) })
	<-done
	require.EqualValues(t, 5, h.started.Load())
}

// read reads a message whole up to the limit, whatever the reader's
// chunks and wherever the buffer must grow (by appending, or into a large
// buffer past keptReadBuffer), and stops at the limit.
// Mutations killed: reading past the limit, stopping at the buffer's first
// capacity, dropping the bytes read with io.EOF, dropping the bytes read
// before the move to a large buffer.
func TestReadBuffersRead(t *testing.T) {
	t.Parallel()
	var p bufferPool
	for _, n := range []int{0, 1, 4095, 4096, 4097, 10_000, keptReadBuffer - 1, keptReadBuffer, keptReadBuffer + 1, 100_000} {
		msg := []byte(strings.Repeat("x", n))
		readers := map[string]func() io.Reader{
			"one byte":    func() io.Reader { return iotest.OneByteReader(bytes.NewReader(msg)) },
			"data on EOF": func() io.Reader { return iotest.DataErrReader(bytes.NewReader(msg)) },
			"whole":       func() io.Reader { return bytes.NewReader(msg) },
		}
		for name, reader := range readers {
			got, err := p.read(reader(), n+1)
			require.NoError(t, err)
			require.Equal(t, msg, got, "%d bytes, %s", n, name)
			if n > 0 {
				p.put(got)
				got, err = p.read(reader(), n-1)
				require.NoError(t, err)
				require.Len(t, got, n-1, "%d bytes, %s, limit %d", n, name, n-1)
				require.Equal(t, msg[:n-1], got)
				p.put(got)
			}
		}
	}
}

// A buffer given back holds the previous message; the next message must
// not be read after it.
// Mutation killed: get returning a given-back buffer without emptying it.
func TestReadBuffersComeBackEmpty(t *testing.T) {
	t.Parallel()
	var p bufferPool
	for range 50 {
		p.put([]byte(`["EVENT",{"previous":"message"}]`))
		require.Empty(t, p.get())
	}
	// A large buffer is kept apart: small messages do not take it.
	p.put(append(make([]byte, 0, keptReadBuffer+1), "previous"...))
	require.LessOrEqual(t, cap(p.get()), keptReadBuffer)
	require.Empty(t, p.getLarge(keptReadBuffer+1))
}

// benchEventMessage is an EVENT message like buzz-bench's: a kind 1 note of
// 200 bytes with a t tag.
func benchEventMessage(b *testing.B) []byte {
	b.Helper()
	sk, err := nostr.GenerateSecretKey()
	require.NoError(b, err)
	ev := &nostr.Event{Kind: 1, CreatedAt: time.Now().Unix(), Content: strings.Repeat("lorem ipsum ", 17)[:200], Tags: nostr.Tags{{"t", "topic-3"}}}
	require.NoError(b, ev.Sign(sk))
	return append(append([]byte(`["EVENT",`), ev.AppendJSON(nil)...), ']')
}

// handleBench is the part of handling a message that needs a deep stack:
// parsing and verifying the event.
func handleBench(b *testing.B, data []byte) {
	m, err := nostr.ParseClientMessage(data, nostr.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	if err := m.(*nostr.EventMessage).Event.Verify(); err != nil {
		b.Fatal(err)
	}
}

// reportCPU reports the process's CPU time (user and system) per op, which
// other jobs on a shared machine disturb less than the wall-clock ns/op.
func reportCPU(b *testing.B, run func()) {
	start := processCPU()
	run()
	b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op")
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkHandleAside compares handling each message on a goroutine of
// its own (before) with the kept handlers (after), 16 connections at once.
// As in the relay, most goroutines are connections' readers, parked with
// shallow stacks: the runtime starts new goroutines at their average
// stack size (measured at each GC), so a handler started per message
// starts small and grows.
func BenchmarkHandleAside(b *testing.B) {
	data := benchEventMessage(b)
	parked := make(chan struct{})
	defer close(parked)
	for range 1000 {
		go func() { <-parked }()
	}
	runtime.GC()
	b.Run("goroutine per message", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8)
		reportCPU(b, func() {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					done := make(chan struct{})
					go func() {
						defer close(done)
						handleBench(b, data)
					}()
					<-done
				}
			})
		})
	})
	b.Run("kept handlers", func(b *testing.B) {
		b.ReportAllocs()
		h := newHandlers(64)
		b.SetParallelism(8)
		reportCPU(b, func() {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					done := make(chan struct{})
					h.run(func() {
						defer close(done)
						handleBench(b, data)
					})
					<-done
				}
			})
		})
	})
}

// BenchmarkReadMessage compares reading a message into a fresh slice
// (before) with a buffer taken from readBuffers and given back (after).
func BenchmarkReadMessage(b *testing.B) {
	data := benchEventMessage(b)
	const limit = 256 << 10
	b.Run("io.ReadAll", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			got, err := io.ReadAll(io.LimitReader(bytes.NewReader(data), limit+1))
			if err != nil || len(got) != len(data) {
				b.Fatal(err)
			}
		}
	})
	b.Run("readBuffers", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			got, err := readBuffers.read(bytes.NewReader(data), limit+1)
			if err != nil || len(got) != len(data) {
				b.Fatal(err)
			}
			readBuffers.put(got)
		}
	})
}

// A connection's writer runs on a kept goroutine too: replies written one
// after another start one goroutine in all, not one each.
// Mutation killed: starting the writer with a go statement (the server's
// handlers start none).
func TestRepliesAreWrittenOnKeptGoroutines(t *testing.T) {
	t.Parallel()
	c, client := acceptTestConn(t)
	h := newHandlers(4)
	c.srv.handlers = h // before anything is sent, so before any writer starts
	for i := range 20 {
		require.Eventually(t, func() bool { return h.started.Load() == 0 || h.idle.Load() == 1 }, 30*time.Second, time.Millisecond)
		want := nostr.EncodeNotice(fmt.Sprintf("reply %d", i))
		require.NoError(t, c.send(want))
		require.Equal(t, want, readMessages(t, client, 1)[0])
	}
	require.EqualValues(t, 1, h.started.Load())
}
