package relay

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

// A small answer is held until it is complete, so a failing read can
// still answer with its own status; nothing is written before finish.
func TestQueryAnswerHoldsASmallAnswer(t *testing.T) {
	rec := httptest.NewRecorder()
	sent := 0
	a := newQueryAnswer(rec, 1<<20, func() { sent++ })
	require.NoError(t, a.add([]byte(`{"id":"a"}`)))
	require.NoError(t, a.add([]byte(`{"id":"b"}`)))
	require.Zero(t, rec.Body.Len(), "nothing written before the read ends")
	require.Zero(t, sent, "no 200 before the read ends")
	require.NotPanics(t, a.abortIfStreaming, "a read failing now still gets its status")
	a.finish()
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	require.Equal(t, `{"events":[{"id":"a"},{"id":"b"}]}`+"\n", rec.Body.String())
}

// Past streamAfter bytes the 200 is sent and events are written as they
// come, so a large answer never sits whole in memory; a read failing after
// that aborts the response rather than ending a well-formed partial body.
// Mutations killed: holding the whole answer (nothing written before
// finish), dropping or misplacing the held part or a separator (the body
// differs), returning instead of aborting after the 200.
func TestQueryAnswerStreamsALargeAnswer(t *testing.T) {
	rec := httptest.NewRecorder()
	streams := 0
	a := newQueryAnswer(rec, 30, func() { streams++ })
	require.NoError(t, a.add([]byte(`{"id":"a"}`)))
	require.Zero(t, rec.Body.Len())
	require.NoError(t, a.add([]byte(`{"id":"b"}`)))
	require.Equal(t, `{"events":[{"id":"a"},{"id":"b"}`, rec.Body.String(), "written once past the threshold")
	require.NoError(t, a.add([]byte(`{"id":"c"}`)))
	require.Equal(t, `{"events":[{"id":"a"},{"id":"b"},{"id":"c"}`, rec.Body.String(), "then each event as it comes")
	require.Equal(t, 1, streams)
	require.PanicsWithValue(t, http.ErrAbortHandler, a.abortIfStreaming)
	a.finish()
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, `{"events":[{"id":"a"},{"id":"b"},{"id":"c"}]}`+"\n", rec.Body.String())
}
