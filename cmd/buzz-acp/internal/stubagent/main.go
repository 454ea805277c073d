// Command stubagent is a minimal agent speaking the Agent Client Protocol on
// stdin and stdout, for buzz-acp's end-to-end tests. Each prompt is appended
// as one JSON line to the file named by -log (with the moment it arrived), and answered with "ack <event id> in <session>" so a test can
// match each answer to the message that caused it. A prompt containing
// "[hold]" is answered only once the file named by -hold exists, so a test
// can stop buzz-acp in the middle of a turn. A prompt containing "[long N]"
// has N more bytes of "x" after that answer, streamed in 64 KiB chunks, as
// an agent told to write at length would. A prompt containing "[stubborn]"
// ignores being cancelled: it goes on until the next prompt of its session
// arrives (or the -hold file exists), then streams "late text of <event
// id>" and only then ends; the session's next prompt waits for it, as one
// turn at a time per session. Each session/cancel is logged as a line with
// "cancelled": true.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	acp "github.com/coder/acp-go-sdk"
)

// Logged is one prompt as the stub received it.
type Logged struct {
	Session    string `json:"session"`
	EventID    string `json:"event_id"`
	Text       string `json:"text"`
	ReceivedNS int64  `json:"received_unix_nano"`
	Cancelled  bool   `json:"cancelled,omitempty"`
}

// stubbornTurn is a "[stubborn]" turn in progress.
type stubbornTurn struct {
	cancelled, nextPrompt, done chan struct{}
	cancelOnce, nextOnce        sync.Once
}

type stub struct {
	conn *acp.AgentSideConnection
	mu   sync.Mutex
	log  *os.File
	hold string
	next int
	// stubborn holds the "[stubborn]" turn in progress per session.
	stubborn map[acp.SessionId]*stubbornTurn
}

func main() {
	logPath := flag.String("log", "", "append each prompt to this file as a JSON line")
	holdPath := flag.String("hold", "", "answer a [hold] prompt only once this file exists")
	flag.Parse()
	s := &stub{hold: *holdPath, stubborn: map[acp.SessionId]*stubbornTurn{}}
	if path := *logPath; path != "" {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			fmt.Fprintln(os.Stderr, "stubagent:", err)
			os.Exit(1)
		}
		s.log = f
	}
	s.conn = acp.NewAgentSideConnection(s, os.Stdout, os.Stdin)
	s.conn.SetLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	<-s.conn.Done()
}

func (s *stub) Initialize(context.Context, acp.InitializeRequest) (acp.InitializeResponse, error) {
	return acp.InitializeResponse{ProtocolVersion: acp.ProtocolVersionNumber}, nil
}

func (s *stub) Authenticate(context.Context, acp.AuthenticateRequest) (acp.AuthenticateResponse, error) {
	return acp.AuthenticateResponse{}, nil
}

func (s *stub) NewSession(context.Context, acp.NewSessionRequest) (acp.NewSessionResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	return acp.NewSessionResponse{SessionId: acp.SessionId(fmt.Sprintf("stub-%d", s.next))}, nil
}

func (s *stub) Prompt(ctx context.Context, p acp.PromptRequest) (acp.PromptResponse, error) {
	at := time.Now().UnixNano()
	var text strings.Builder
	for _, block := range p.Prompt {
		if block.Text != nil {
			text.WriteString(block.Text.Text)
		}
	}
	eventID := ""
	if buzz, ok := p.Meta["buzz"].(map[string]any); ok {
		eventID, _ = buzz["event_id"].(string)
	}
	s.mu.Lock()
	earlier := s.stubborn[p.SessionId]
	var turn *stubbornTurn
	if strings.Contains(text.String(), "[stubborn]") {
		turn = &stubbornTurn{cancelled: make(chan struct{}), nextPrompt: make(chan struct{}), done: make(chan struct{})}
		s.stubborn[p.SessionId] = turn
	}
	s.mu.Unlock()
	s.write(Logged{Session: string(p.SessionId), EventID: eventID, Text: text.String(), ReceivedNS: at})
	if earlier != nil {
		earlier.nextOnce.Do(func() { close(earlier.nextPrompt) })
		<-earlier.done
	}
	if turn != nil {
		return s.stubbornPrompt(p.SessionId, eventID, turn)
	}
	if s.hold != "" && strings.Contains(text.String(), "[hold]") {
		for {
			if _, err := os.Stat(s.hold); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return acp.PromptResponse{StopReason: acp.StopReasonCancelled}, nil
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	// The answer comes in two chunks, as a streaming agent's would.
	parts := []string{"ack " + eventID, " in " + string(p.SessionId)}
	if m := longAnswer.FindStringSubmatch(text.String()); m != nil {
		n, _ := strconv.Atoi(m[1])
		for ; n > 0; n -= 64 << 10 {
			parts = append(parts, strings.Repeat("x", min(n, 64<<10)))
		}
	}
	for _, part := range parts {
		if err := s.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: p.SessionId, Update: acp.UpdateAgentMessageText(part)}); err != nil {
			return acp.PromptResponse{}, err
		}
	}
	return acp.PromptResponse{StopReason: acp.StopReasonEndTurn}, nil
}

var longAnswer = regexp.MustCompile(`\[long (\d+)\]`)

func (s *stub) write(l Logged) {
	if s.log == nil {
		return
	}
	line, _ := json.Marshal(l)
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = s.log.Write(append(line, '\n'))
}

// stubbornPrompt is a turn that ignores its cancel: once cancelled, it waits
// for the session's next prompt (or the hold file), streams text anyway,
// and only then ends.
func (s *stub) stubbornPrompt(session acp.SessionId, eventID string, turn *stubbornTurn) (acp.PromptResponse, error) {
	defer func() {
		s.mu.Lock()
		if s.stubborn[session] == turn {
			delete(s.stubborn, session)
		}
		s.mu.Unlock()
		close(turn.done)
	}()
	<-turn.cancelled
	for {
		if _, err := os.Stat(s.hold); err == nil {
			break
		}
		select {
		case <-turn.nextPrompt:
		case <-time.After(5 * time.Millisecond):
			continue
		}
		break
	}
	// Its own context is cancelled by now: the stubborn agent writes anyway.
	if err := s.conn.SessionUpdate(context.Background(), acp.SessionNotification{SessionId: session, Update: acp.UpdateAgentMessageText("late text of " + eventID)}); err != nil {
		return acp.PromptResponse{}, err
	}
	return acp.PromptResponse{StopReason: acp.StopReasonCancelled}, nil
}

func (s *stub) Cancel(_ context.Context, n acp.CancelNotification) error {
	s.write(Logged{Session: string(n.SessionId), Cancelled: true, ReceivedNS: time.Now().UnixNano()})
	s.mu.Lock()
	turn := s.stubborn[n.SessionId]
	s.mu.Unlock()
	if turn != nil {
		turn.cancelOnce.Do(func() { close(turn.cancelled) })
	}
	return nil
}

func (s *stub) CloseSession(context.Context, acp.CloseSessionRequest) (acp.CloseSessionResponse, error) {
	return acp.CloseSessionResponse{}, nil
}

func (s *stub) ListSessions(context.Context, acp.ListSessionsRequest) (acp.ListSessionsResponse, error) {
	return acp.ListSessionsResponse{}, nil
}

func (s *stub) ResumeSession(context.Context, acp.ResumeSessionRequest) (acp.ResumeSessionResponse, error) {
	return acp.ResumeSessionResponse{}, nil
}

func (s *stub) SetSessionConfigOption(context.Context, acp.SetSessionConfigOptionRequest) (acp.SetSessionConfigOptionResponse, error) {
	return acp.SetSessionConfigOptionResponse{}, nil
}

func (s *stub) SetSessionMode(context.Context, acp.SetSessionModeRequest) (acp.SetSessionModeResponse, error) {
	return acp.SetSessionModeResponse{}, nil
}
