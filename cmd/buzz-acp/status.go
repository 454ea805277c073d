package main

import (
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"time"
)

// status is what a supervisor reads: one JSON line on stdout at every
// change of state (connected, disconnected, stopping, stopped), and the
// same object from GET /health.
type status struct {
	mu  sync.Mutex
	out io.Writer // nil = no status lines
	now func() time.Time
	s   statusLine
}

type statusLine struct {
	State             string           `json:"state"` // starting, connected, disconnected, stopping, stopped
	Relay             string           `json:"relay"`
	Agent             string           `json:"agent_pubkey"`
	Channels          int              `json:"channels"`
	Sessions          int              `json:"sessions"`
	Reconnects        int              `json:"reconnects"`
	LastError         string           `json:"last_error,omitempty"`
	DoorbellsVerified int64            `json:"doorbells_verified"`
	Mentions          int64            `json:"mentions"`
	Prompts           int64            `json:"prompts"`
	Answers           int64            `json:"answers"`
	Failures          int64            `json:"failures"`
	Dropped           map[string]int64 `json:"dropped"` // by reason
	Since             time.Time        `json:"since"`   // when State last changed
}

func newStatus(out io.Writer, relay, agent string) *status {
	st := &status{out: out, now: time.Now}
	st.s = statusLine{State: "starting", Relay: relay, Agent: agent, Dropped: map[string]int64{}, Since: st.now()}
	return st
}

// snapshot copies the current status.
func (st *status) snapshot() statusLine {
	st.mu.Lock()
	defer st.mu.Unlock()
	c := st.s
	c.Dropped = make(map[string]int64, len(st.s.Dropped))
	for k, v := range st.s.Dropped {
		c.Dropped[k] = v
	}
	return c
}

func (st *status) setState(state string, change func(*statusLine)) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if change != nil {
		change(&st.s)
	}
	if state == "" || state == st.s.State {
		return
	}
	if state == "connected" && st.s.State == "disconnected" {
		st.s.Reconnects++
	}
	st.s.State, st.s.Since = state, st.now()
	if st.out != nil {
		b, _ := json.Marshal(st.s)
		_, _ = st.out.Write(append(b, '\n'))
	}
}

func (st *status) connected(channels int) {
	st.setState("connected", func(s *statusLine) { s.Channels, s.LastError = channels, "" })
}

func (st *status) disconnected(err error) {
	st.setState("disconnected", func(s *statusLine) {
		if err != nil {
			s.LastError = err.Error()
		}
	})
}

func (st *status) count(f func(*statusLine)) {
	st.mu.Lock()
	f(&st.s)
	st.mu.Unlock()
}

func (st *status) dropped(reason string) { st.droppedN(reason, 1) }
func (st *status) droppedN(reason string, n int64) {
	st.count(func(s *statusLine) { s.Dropped[reason] += n })
}
func (st *status) verified()      { st.count(func(s *statusLine) { s.DoorbellsVerified++ }) }
func (st *status) mentioned()     { st.count(func(s *statusLine) { s.Mentions++ }) }
func (st *status) prompted()      { st.count(func(s *statusLine) { s.Prompts++ }) }
func (st *status) answered()      { st.count(func(s *statusLine) { s.Answers++ }) }
func (st *status) failed()        { st.count(func(s *statusLine) { s.Failures++ }) }
func (st *status) sessions(n int) { st.count(func(s *statusLine) { s.Sessions = n }) }

// ServeHTTP answers GET /health: 200 while connected to the relay, else
// 503, with the status object either way.
func (st *status) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/health" {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusMethodNotAllowed)
		_, _ = w.Write([]byte(`{"error":"method not allowed"}` + "\n"))
		return
	}
	snap := st.snapshot()
	code := http.StatusOK
	if snap.State != "connected" {
		code = http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(snap)
}
