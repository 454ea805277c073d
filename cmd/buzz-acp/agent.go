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

// prompt runs one turn and returns the agent's message text, and whether
// some of it was dropped for being more than could be posted.
func (a *localAgent) prompt(ctx context.Context, session acp.SessionId, text string, meta map[string]any) (string, bool, acp.StopReason, error) {
	answer := a.collect(session)
	defer func() {
		a.mu.Lock()
		delete(a.answers, session)
		a.mu.Unlock()
	}()
	resp, err := a.conn.Prompt(ctx, acp.PromptRequest{
		SessionId: session,
		Prompt:    []acp.ContentBlock{acp.TextBlock(text)},
		Meta:      meta,
	})
	if err != nil {
		if ctx.Err() != nil {
			// Tell the agent to stop the turn nobody waits for any more.
			cancelCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = a.conn.Cancel(cancelCtx, acp.CancelNotification{SessionId: session})
			cancel()
		}
		return "", false, "", fmt.Errorf("ACP session/prompt: %w", err)
	}
	held, cut := answer.result()
	return held, cut, resp.StopReason, nil
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
