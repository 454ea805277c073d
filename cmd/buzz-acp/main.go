// Command buzz-acp runs a local agent for a Buzz relay. It authenticates as
// the agent (NIP-42, with the owner's NIP-OA attestation when given),
// listens for the doorbells and mentions that name the agent in the
// channels it belongs to, and drives the agent process over the Agent
// Client Protocol (JSON-RPC on its stdin and stdout): one ACP session per
// channel or thread, prompts only from verified doorbells and signed
// messages, answers posted back as channel messages.
//
//	buzz-acp [flags] -- AGENT_COMMAND [ARGS...]
//
// Settings come from env vars, overridden by flags (see usageText). A JSON
// status line goes to stdout at every change of connection state; logs go
// to stderr. SIGINT or SIGTERM stops it gracefully: no new prompts, turns in
// progress get BUZZ_ACP_SHUTDOWN_GRACE to finish and post their answers.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/buzzrelay/buzz/internal/nipoa"
	"github.com/buzzrelay/buzz/internal/nostr"
)

const usageText = `buzz-acp [flags] -- AGENT_COMMAND [ARGS...]
env (flags override):
  BUZZ_RELAY_URL                 relay WebSocket URL (ws:// or wss://)          --relay
  BUZZ_PRIVATE_KEY               the agent's 64-hex secret key
  BUZZ_PRIVATE_KEY_FILE          file holding it instead                        --key-file
  BUZZ_AUTH_TAG                  the owner's NIP-OA auth tag, a JSON array      --auth-tag
  BUZZ_RELAY_PUBKEY              the relay key that signs doorbells (default: the relay's NIP-11 "self")
  BUZZ_ACP_AGENT                 the agent command line, when not given after --
  BUZZ_ACP_CWD                   the agent's working directory (default: the current one)
  BUZZ_ACP_HEALTH_ADDR           serve GET /health on this address (default: off)  --health
  BUZZ_ACP_MEMBERSHIP_REFRESH    how often channel membership is re-read (30s)
  BUZZ_ACP_BACKOFF_MIN           first reconnect delay (500ms)
  BUZZ_ACP_BACKOFF_MAX           longest reconnect delay (30s)
  BUZZ_ACP_PROMPT_TIMEOUT        longest agent turn (10m)
  BUZZ_ACP_CANCEL_GRACE          a timed-out turn's time to end before its session is given up (30s)
  BUZZ_ACP_SHUTDOWN_GRACE        time turns in progress get at shutdown (10s)
  BUZZ_ACP_SESSION_QUEUE         prompts waiting per session before more are refused (32)
  BUZZ_ACP_INCOMING_QUEUE        messages waiting for verification before more are refused (1024)
  BUZZ_ACP_SESSION_IDLE          a channel's or thread's session without prompts this long is closed (1h)
  BUZZ_ACP_MAX_SESSIONS          sessions open at once, so turns at once; an idle one is closed to make room (16)
  BUZZ_ACP_MAX_PER_AUTHOR        mentions of one author waiting or running before more of theirs are refused; not the owner's, nor doorbells (4)
  BUZZ_ACP_STATE_FILE            where what was handled survives a restart, so one catches up (default: none)  --state-file
  BUZZ_ACP_CATCHUP_WINDOW        a catch-up reaches at most this far back (24h)
  BUZZ_ACP_CATCHUP_LIMIT         stored messages one catch-up hands on at most, the newest (500)`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	code := exitStatus(run(ctx, os.Args[1:], os.Getenv, os.Stdout, log), os.Stdout, os.Stderr, log)
	stop()
	os.Exit(code)
}

// usageError is a command line that cannot run: the reason goes out with
// the usage, and the exit status is 2.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

// exitStatus says how run ended, for the shell: --help prints the usage on
// stdout (0); a command line that cannot run prints the reason and the
// usage on stderr (2); any other failure is logged (1).
func exitStatus(err error, stdout, stderr io.Writer, log *slog.Logger) int {
	var usage usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprintln(stdout, usageText)
		return 0
	case errors.As(err, &usage):
		fmt.Fprintf(stderr, "buzz-acp: %v\n%s\n", usage.err, usageText)
		return 2
	default:
		log.Error("buzz-acp", "err", err)
		return 1
	}
}

// run parses the settings and serves until ctx ends or the agent exits.
func run(ctx context.Context, args []string, env func(string) string, stdout io.Writer, log *slog.Logger) error {
	cfg, healthAddr, err := parseSettings(args, env)
	if err != nil {
		return err
	}
	st := newStatus(stdout, cfg.RelayURL, cfg.Key.PublicKeyHex())
	if healthAddr != "" {
		ln, err := net.Listen("tcp", healthAddr)
		if err != nil {
			return fmt.Errorf("health endpoint: %w", err)
		}
		srv := &http.Server{Handler: st, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		log.Info("health endpoint", "addr", ln.Addr().String())
	}
	return serve(ctx, cfg, st, log)
}

// serve starts the agent and the bridge, and on ctx's end stops them in
// order: no new prompts, turns in progress finish, then the agent exits.
func serve(ctx context.Context, cfg settings, st *status, log *slog.Logger) error {
	j, err := openJournal(cfg.StateFile)
	if err != nil {
		return err
	}
	defer j.close()
	if cfg.StateFile == "" {
		log.Warn("no BUZZ_ACP_STATE_FILE: what names the agent while buzz-acp is not running is never handled")
	}
	agent, err := startAgent(ctx, cfg.AgentCommand, cfg.AgentCwd, log)
	if err != nil {
		return err
	}
	b := newBridge(cfg, agent, j, log, st)
	runErr := b.run(ctx) // at shutdown it returns once the turns in progress ended (or the grace did)
	st.setState("stopping", nil)
	b.wait(cfg.ShutdownGrace) // when it returned while disconnected
	agent.stop(cfg.ShutdownGrace)
	st.setState("stopped", nil)
	return runErr
}

func parseSettings(args []string, env func(string) string) (settings, string, error) {
	cfg := settings{
		RelayURL:          env("BUZZ_RELAY_URL"),
		RelayPubkey:       strings.TrimSpace(env("BUZZ_RELAY_PUBKEY")),
		AgentCwd:          env("BUZZ_ACP_CWD"),
		MembershipRefresh: 30 * time.Second,
		BackoffMin:        500 * time.Millisecond,
		BackoffMax:        30 * time.Second,
		PromptTimeout:     10 * time.Minute,
		CancelGrace:       30 * time.Second,
		ShutdownGrace:     10 * time.Second,
		SessionQueue:      32,
		IncomingQueue:     1024,
		SessionIdle:       time.Hour,
		MaxSessions:       16,
		MaxPerAuthor:      4,
		StateFile:         env("BUZZ_ACP_STATE_FILE"),
		CatchUpWindow:     24 * time.Hour,
		CatchUpLimit:      500,
	}
	keyFile := env("BUZZ_PRIVATE_KEY_FILE")
	authTag := env("BUZZ_AUTH_TAG")
	health := env("BUZZ_ACP_HEALTH_ADDR")
	fs := flag.NewFlagSet("buzz-acp", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&cfg.RelayURL, "relay", cfg.RelayURL, "relay URL")
	fs.StringVar(&keyFile, "key-file", keyFile, "file holding the agent's 64-hex secret key")
	fs.StringVar(&authTag, "auth-tag", authTag, "the owner's NIP-OA auth tag (JSON array)")
	fs.StringVar(&health, "health", health, "address for GET /health")
	fs.StringVar(&cfg.StateFile, "state-file", cfg.StateFile, "where what was handled survives a restart")
	if err := fs.Parse(args); err != nil {
		return cfg, "", usageError{err}
	}
	for _, d := range []struct {
		name string
		dst  *time.Duration
	}{
		{"BUZZ_ACP_MEMBERSHIP_REFRESH", &cfg.MembershipRefresh},
		{"BUZZ_ACP_BACKOFF_MIN", &cfg.BackoffMin},
		{"BUZZ_ACP_BACKOFF_MAX", &cfg.BackoffMax},
		{"BUZZ_ACP_PROMPT_TIMEOUT", &cfg.PromptTimeout},
		{"BUZZ_ACP_CANCEL_GRACE", &cfg.CancelGrace},
		{"BUZZ_ACP_SHUTDOWN_GRACE", &cfg.ShutdownGrace},
		{"BUZZ_ACP_SESSION_IDLE", &cfg.SessionIdle},
		{"BUZZ_ACP_CATCHUP_WINDOW", &cfg.CatchUpWindow},
	} {
		if v := env(d.name); v != "" {
			parsed, err := time.ParseDuration(v)
			if err != nil || parsed <= 0 {
				return cfg, "", fmt.Errorf("%s: want a positive duration such as 30s, got %q", d.name, v)
			}
			*d.dst = parsed
		}
	}
	for _, q := range []struct {
		name string
		dst  *int
	}{
		{"BUZZ_ACP_SESSION_QUEUE", &cfg.SessionQueue},
		{"BUZZ_ACP_INCOMING_QUEUE", &cfg.IncomingQueue},
		{"BUZZ_ACP_MAX_SESSIONS", &cfg.MaxSessions},
		{"BUZZ_ACP_MAX_PER_AUTHOR", &cfg.MaxPerAuthor},
		{"BUZZ_ACP_CATCHUP_LIMIT", &cfg.CatchUpLimit},
	} {
		if v := env(q.name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return cfg, "", fmt.Errorf("%s: want a positive whole number, got %q", q.name, v)
			}
			*q.dst = n
		}
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		return cfg, "", errors.New("BUZZ_ACP_BACKOFF_MAX is shorter than BUZZ_ACP_BACKOFF_MIN")
	}
	if !strings.HasPrefix(cfg.RelayURL, "ws://") && !strings.HasPrefix(cfg.RelayURL, "wss://") {
		return cfg, "", fmt.Errorf("BUZZ_RELAY_URL: want a ws:// or wss:// URL, got %q", cfg.RelayURL)
	}
	if cfg.RelayPubkey != "" && !nostr.IsHex64(cfg.RelayPubkey) {
		return cfg, "", errors.New("BUZZ_RELAY_PUBKEY: want 64 lowercase hex")
	}
	key, err := loadKey(env("BUZZ_PRIVATE_KEY"), keyFile)
	if err != nil {
		return cfg, "", err
	}
	cfg.Key = key
	if authTag != "" {
		att, err := nipoa.ParseHeader(authTag)
		if err != nil {
			return cfg, "", fmt.Errorf("BUZZ_AUTH_TAG: %w", err)
		}
		// Fail here, not as a refused AUTH on every reconnect.
		if err := att.VerifyFor(key.PublicKeyHex(), time.Now().Unix()); err != nil {
			return cfg, "", fmt.Errorf("BUZZ_AUTH_TAG: %w", err)
		}
		cfg.AuthTag = att.Tag()
	}
	cfg.AgentCommand = fs.Args()
	if len(cfg.AgentCommand) == 0 {
		cfg.AgentCommand = strings.Fields(env("BUZZ_ACP_AGENT"))
	}
	if len(cfg.AgentCommand) == 0 {
		return cfg, "", usageError{errors.New("no agent command: give it after -- or in BUZZ_ACP_AGENT")}
	}
	if cfg.AgentCwd == "" {
		if cfg.AgentCwd, err = os.Getwd(); err != nil {
			return cfg, "", err
		}
	}
	return cfg, health, nil
}

func loadKey(hexKey, file string) (*nostr.SecretKey, error) {
	src := "BUZZ_PRIVATE_KEY"
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("key file: %w", err)
		}
		src, hexKey = file, string(b)
	}
	hexKey = strings.TrimSpace(hexKey)
	if hexKey == "" {
		return nil, errors.New("BUZZ_PRIVATE_KEY (or BUZZ_PRIVATE_KEY_FILE) is not set: the agent's 64-hex secret key")
	}
	key, err := nostr.SecretKeyFromHex(hexKey)
	if err != nil {
		return nil, fmt.Errorf("%s: not a 64-hex secret key", src)
	}
	return key, nil
}
