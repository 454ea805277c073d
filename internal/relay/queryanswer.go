package relay

import "net/http"

// queryStreamAfter is how much of a /query answer is held before its 200 is
// sent and the rest is written as it is read. An answer may be 10 filters
// of 500 events of up to 256 KB each: held whole, one request could pin over
// a gigabyte. A read that fails within it still gets its own error status.
const queryStreamAfter = 1 << 20

// queryAnswer writes the body of a /query answer, {"events":[...]}.
type queryAnswer struct {
	w           http.ResponseWriter
	buf         []byte
	events      int
	streamAfter int
	streaming   bool   // the 200 is sent; events are written as they come
	onStream    func() // told once, when the 200 is sent
}

func newQueryAnswer(w http.ResponseWriter, streamAfter int, onStream func()) *queryAnswer {
	return &queryAnswer{w: w, buf: []byte(`{"events":[`), streamAfter: streamAfter, onStream: onStream}
}

// add appends one event's JSON object, writing it out once the answer
// streams. An error is the client's connection failing.
func (a *queryAnswer) add(event []byte) error {
	if a.events > 0 {
		a.buf = append(a.buf, ',')
	}
	a.events++
	a.buf = append(a.buf, event...)
	if !a.streaming {
		if len(a.buf) < a.streamAfter {
			return nil
		}
		a.start()
	}
	_, err := a.w.Write(a.buf)
	a.buf = a.buf[:0]
	return err
}

// finish ends a complete answer.
func (a *queryAnswer) finish() {
	a.buf = append(a.buf, "]}\n"...)
	if !a.streaming {
		a.start()
	}
	_, _ = a.w.Write(a.buf)
}

// abortIfStreaming ends the response of a read that failed after its 200
// was sent: net/http then cuts the connection instead of ending the body,
// so the client never takes part of an answer for all of it. Before the
// 200 it returns, and the caller answers with the failure's status.
func (a *queryAnswer) abortIfStreaming() {
	if a.streaming {
		panic(http.ErrAbortHandler)
	}
}

func (a *queryAnswer) start() {
	a.streaming = true
	if a.onStream != nil {
		a.onStream()
	}
	a.w.Header().Set("Content-Type", "application/json")
	a.w.WriteHeader(http.StatusOK)
}
