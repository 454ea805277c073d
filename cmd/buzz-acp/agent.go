package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"time"

	acp "github.com/coder/acp-go-sdk"
)

// localAgent is the agent process, driven over the Agent Client Protocol
// on its stdin and stdout. Its stderr is passed through for the operator.
type localAgent struct {
	cmd   *exec.Cmd
	stdin io.Closer
	conn  *acp.ClientSideConnection
	log   *slog.Logger
	cwd   string

	mu      sync.Mutex
	answers map[acp.SessionId]*answerText // the text of each session's turn in progress
	// maxAnswerBytes is how much of one turn's text is held (answerLimits.heldBytes).
	maxAnswerBytes int
	exited         chan struct{}
	// canClose: the agent offers session/close, so an idle session's state
	// can be released on its side too.
	canClose bool
}

// startAgent runs argv and completes the ACP handshake.
func startAgent(ctx context.Context, argv []string, cwd string, log *slog.Logger) (*localAgent, error) {
	if len(argv) == 0 {
		return nil, errors.New("no agent command: give it after the flags or in BUZZ_ACP_AGENT")
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = cwd
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start agent %q: %w", argv[0], err)
	}
	a := &localAgent{cmd: cmd, stdin: stdin, log: log, cwd: cwd, answers: map[acp.SessionId]*answerText{},
		maxAnswerBytes: defaultAnswerLimits.heldBytes(), exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(a.exited)
	}()
	a.conn = acp.NewClientSideConnection(agentClient{a}, stdin, stdout)
	a.conn.SetLogger(log.With("component", "acp"))
	initCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// The bridge offers no file system or terminal: the agent works from
	// the prompt it is given, and anything else it has is its own.
	init, err := a.conn.Initialize(initCtx, acp.InitializeRequest{
		ProtocolVersion:    acp.ProtocolVersionNumber,
		ClientCapabilities: acp.ClientCapabilities{},
	})
	if err != nil {
		a.stop(time.Second)
		return nil, fmt.Errorf("ACP initialize: %w", err)
	}
	a.canClose = init.AgentCapabilities.SessionCapabilities.Close != nil
	return a, nil
}

// closeSession releases an idle session on the agent's side, when it
// offers that; otherwise the bridge only forgets it.
func (a *localAgent) closeSession(session acp.SessionId) {
	if !a.canClose || session == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := a.conn.CloseSession(ctx, acp.CloseSessionRequest{SessionId: session}); err != nil {
		a.log.Warn("ACP session/close", "session", session, "err", err)
	}
}

// Exited is closed when the agent process ends.
func (a *localAgent) Exited() <-chan struct{} { return a.exited }

// newSession opens one ACP session (one per channel or thread).
func (a *localAgent) newSession(ctx context.Context) (acp.SessionId, error) {
	resp, err := a.conn.NewSession(ctx, acp.NewSessionRequest{Cwd: a.cwd, McpServers: []acp.McpServer{}})
	if err != nil {
		return "", fmt.Errorf("ACP session/new: %w", err)
	}
	return resp.SessionId, nil
}

// setAnswerCap sets how much of a turn's text is held, once the relay's
// limits are known.
func (a *localAgent) setAnswerCap(bytes int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.maxAnswerBytes = bytes
}

// collect starts holding session's turn text.
func (a *localAgent) collect(session acp.SessionId) *answerText {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := &answerText{max: a.maxAnswerBytes}
	a.answers[session] = t
	return t
}

// appendText adds a chunk of the agent's text to its session's turn.
func (a *localAgent) appendText(session acp.SessionId, text string) {
	a.mu.Lock()
	t := a.answers[session]
	a.mu.Unlock()
	if t != nil {
		t.write(text)
	}
}

// errTurnAbandoned: a turn outlived its timeout and then the cancel grace.
// The agent may still be streaming it, and ACP chunks carry no turn, so
// its session is given up: the next prompt opens a new one.
var errTurnAbandoned = errors.New("the agent did not end the turn it was told to cancel")

// prompt runs one turn and returns the agent's message text, and whether
// some of it was dropped for being more than could be posted. A turn that
// outlives ctx is cancelled, and prompt waits up to cancelGrace for the
// agent to end it: until then whatever the agent streams is that turn's
// and is discarded, rather than the next turn's answer. When the agent
// does not end it in time the error is errTurnAbandoned.
func (a *localAgent) prompt(ctx context.Context, session acp.SessionId, text string, meta map[string]any, cancelGrace time.Duration) (string, bool, acp.StopReason, error) {
	answer := a.collect(session)
	defer func() {
		a.mu.Lock()
		if a.answers[session] == answer {
			delete(a.answers, session)
		}
		a.mu.Unlock()
	}()
	// The request outlives ctx by the grace: its response is how the
	// bridge learns the agent has stopped streaming this turn.
	requestCtx, abandon := context.WithCancel(context.WithoutCancel(ctx))
	defer abandon()
	type result struct {
		resp acp.PromptResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := a.conn.Prompt(requestCtx, acp.PromptRequest{
			SessionId: session,
			Prompt:    []acp.ContentBlock{acp.TextBlock(text)},
			Meta:      meta,
		})
		done <- result{resp, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return "", false, "", fmt.Errorf("ACP session/prompt: %w", r.err)
		}
		held, cut := answer.result()
		return held, cut, r.resp.StopReason, nil
	case <-ctx.Done():
	}
	// Tell the agent to stop the turn nobody waits for any more.
	cancelCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = a.conn.Cancel(cancelCtx, acp.CancelNotification{SessionId: session})
	cancel()
	grace := time.NewTimer(cancelGrace)
	defer grace.Stop()
	select {
	case r := <-done:
		stop := acp.StopReason("")
		if r.err == nil {
			stop = r.resp.StopReason
		}
		return "", false, stop, fmt.Errorf("ACP session/prompt: %w (the agent ended the turn, stop reason %q)", ctx.Err(), stop)
	case <-grace.C:
		return "", false, "", fmt.Errorf("ACP session/prompt: %w: %w", ctx.Err(), errTurnAbandoned)
	}
}

// stop closes the agent's stdin (its signal to exit), then kills it if it
// has not exited within grace.
func (a *localAgent) stop(grace time.Duration) {
	_ = a.stdin.Close()
	_ = a.cmd.Process.Signal(os.Interrupt)
	select {
	case <-a.exited:
	case <-time.After(grace):
		_ = a.cmd.Process.Kill()
		<-a.exited
	}
}

// agentClient is the bridge's side of ACP: it collects the agent's message
// text and refuses everything that would need a person or the host.
type agentClient struct{ a *localAgent }

var _ acp.Client = agentClient{}

func (c agentClient) SessionUpdate(_ context.Context, n acp.SessionNotification) error {
	chunk := n.Update.AgentMessageChunk
	if chunk == nil || chunk.Content.Text == nil {
		return nil
	}
	c.a.appendText(n.SessionId, chunk.Content.Text.Text)
	return nil
}

// RequestPermission answers "cancelled": nobody is at the bridge to grant a
// tool call, and a channel message is not consent.
func (agentClient) RequestPermission(context.Context, acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
	return acp.RequestPermissionResponse{Outcome: acp.RequestPermissionOutcome{Cancelled: &acp.RequestPermissionOutcomeCancelled{}}}, nil
}

var errNotOffered = errors.New("not offered by buzz-acp")

func (agentClient) ReadTextFile(context.Context, acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	return acp.ReadTextFileResponse{}, errNotOffered
}

func (agentClient) WriteTextFile(context.Context, acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	return acp.WriteTextFileResponse{}, errNotOffered
}

func (agentClient) CreateTerminal(context.Context, acp.CreateTerminalRequest) (acp.CreateTerminalResponse, error) {
	return acp.CreateTerminalResponse{}, errNotOffered
}

func (agentClient) KillTerminal(context.Context, acp.KillTerminalRequest) (acp.KillTerminalResponse, error) {
	return acp.KillTerminalResponse{}, errNotOffered
}

func (agentClient) TerminalOutput(context.Context, acp.TerminalOutputRequest) (acp.TerminalOutputResponse, error) {
	return acp.TerminalOutputResponse{}, errNotOffered
}

func (agentClient) ReleaseTerminal(context.Context, acp.ReleaseTerminalRequest) (acp.ReleaseTerminalResponse, error) {
	return acp.ReleaseTerminalResponse{}, errNotOffered
}

func (agentClient) WaitForTerminalExit(context.Context, acp.WaitForTerminalExitRequest) (acp.WaitForTerminalExitResponse, error) {
	return acp.WaitForTerminalExitResponse{}, errNotOffered
}
