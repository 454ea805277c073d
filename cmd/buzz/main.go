// Command buzz is the agent-first client for a Buzz relay. Every command
// prints exactly one JSON document on stdout, or a JSON error object
// {"error": ..., "code": ...} on stderr with a non-zero exit status:
// 2 for usage errors and invalid input (nothing was sent), 1 for network,
// timeout and protocol errors, 3 when the relay refused (OK false, CLOSED,
// or an HTTP status instead of the WebSocket upgrade); code is then the
// relay's NIP-01 prefix, such as "restricted", or http_STATUS without one.
//
//	buzz channels list
//	buzz channels create NAME [--private] [--about TEXT]
//	buzz channels join CHANNEL_ID
//	buzz send CHANNEL_ID TEXT [--reply-to EVENT_ID] [--mention PUBKEY]...
//	buzz send --json     < {"channel": ..., "content": ..., "tags": [...]}
//	buzz req FILTER_JSON... [--count | --stream]
//	buzz req --json      < [FILTER, ...]
//	buzz workflows list [CHANNEL_ID] | show ID | runs ID | trigger ID
//	buzz workflows approve|deny APPROVAL_REF
//	buzz users get [--pubkey P]... | [--name TEXT] [--owner me|HEX|NPUB]
//	buzz whoami
//	buzz keygen
//
// BUZZ_PRIVATE_KEY (64-hex secret key) and BUZZ_RELAY_URL (ws:// or wss://)
// configure it; --key-file and --relay override them, and --timeout
// (default 10s) bounds every command.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/buzzrelay/buzz/internal/nipoa"
	"github.com/buzzrelay/buzz/internal/nostr"
)

const usageText = `buzz [--relay URL] [--key-file PATH] [--timeout 10s] COMMAND
  channels list
  channels create NAME [--private] [--about TEXT]
  channels join CHANNEL_ID
  send CHANNEL_ID TEXT [--reply-to EVENT_ID] [--mention PUBKEY]...
  send --json   (stdin: {"channel":...,"content":...,"tags":[[...]],"reply_to":...,"mentions":[...]})
  req FILTER_JSON... [--count | --stream]
  req --json    (stdin: a JSON array of filters, or one filter)
  workflows list [CHANNEL_ID]
  workflows show WORKFLOW_ID
  workflows runs WORKFLOW_ID [--limit 1-100] [--before T --before-id ID]
      --before, --before-id  The previous page's next.before (RFC3339) and next.before_id.
  workflows trigger WORKFLOW_ID      (prints the relay's {"run_id":...})
  workflows approve|deny APPROVAL_REF
  users get [--pubkey HEX|NPUB]... | [--name TEXT] [--owner me|HEX|NPUB] [--format compact|json]
      --owner  Filter agents by verified owner (` + "`me`" + `, 64-char hex, or npub); "my Honey" is
               users get --name Honey --owner me. Nothing owned matching prints [].
  whoami
  keygen
env: BUZZ_PRIVATE_KEY (64-hex secret key), BUZZ_RELAY_URL (ws:// or wss://),
     BUZZ_AUTH_TAG (an agent's NIP-OA auth tag, JSON: sent on AUTH and as X-Auth-Tag,
     so the relay records the owner; "me" is then that owner)
exit: 0 ok, 1 network/timeout/protocol error, 2 usage or invalid input, 3 refused by the relay (code = its prefix, else http_STATUS)`

const defaultTimeout = 10 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one command and returns the process exit status.
func run(ctx context.Context, args []string, env func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	o := &options{env: env, stdin: stdin, stdout: stdout, timeout: defaultTimeout}
	result, err := dispatch(ctx, o, args)
	if err == nil && result != nil {
		err = writeJSON(stdout, result)
	}
	if err == nil {
		return 0
	}
	ce := classify(err)
	_ = writeJSON(stderr, errorJSON{Error: ce.msg, Code: ce.code})
	return ce.exit
}

// errorJSON is what a failed command prints on stderr.
type errorJSON struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

// cliError is an error with its JSON code and exit status.
type cliError struct {
	code string
	msg  string
	exit int
}

func (e *cliError) Error() string { return e.msg }

func usageErr(format string, args ...any) error {
	return &cliError{code: "usage", msg: fmt.Sprintf(format, args...), exit: 2}
}

func invalidErr(format string, args ...any) error {
	return &cliError{code: "invalid", msg: fmt.Sprintf(format, args...), exit: 2}
}

func configErr(format string, args ...any) error {
	return &cliError{code: "config", msg: fmt.Sprintf(format, args...), exit: 2}
}

func classify(err error) *cliError {
	var ce *cliError
	var re *RelayError
	var pe *ProtocolError
	switch {
	case errors.As(err, &ce):
		return ce
	case errors.As(err, &re):
		return &cliError{code: re.Prefix, msg: re.Msg, exit: 3}
	case errors.As(err, &pe):
		return &cliError{code: "protocol", msg: pe.Msg, exit: 1}
	case errors.Is(err, context.DeadlineExceeded):
		return &cliError{code: "timeout", msg: err.Error(), exit: 1}
	case errors.Is(err, context.Canceled):
		return &cliError{code: "interrupted", msg: err.Error(), exit: 1}
	default:
		return &cliError{code: "network", msg: err.Error(), exit: 1}
	}
}

func writeJSON(w io.Writer, v any) error {
	b, err := marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// options holds the global flags and the process's I/O.
type options struct {
	relay   string
	keyFile string
	timeout time.Duration
	env     func(string) string
	stdin   io.Reader
	stdout  io.Writer
}

// flags returns a flag set with the global flags registered; every command
// accepts them anywhere on its command line.
func (o *options) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.relay, "relay", o.relay, "relay URL (default $BUZZ_RELAY_URL)")
	fs.StringVar(&o.keyFile, "key-file", o.keyFile, "file holding the 64-hex secret key (default $BUZZ_PRIVATE_KEY)")
	fs.Var((*timeoutValue)(&o.timeout), "timeout", "bound on the whole command (0 = none)")
	return fs
}

// timeoutValue accepts a Go duration ("10s", "1m") or a number of seconds.
type timeoutValue time.Duration

func (t *timeoutValue) String() string { return time.Duration(*t).String() }

func (t *timeoutValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		secs, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil {
			return errors.New("want a duration such as 10s or a number of seconds")
		}
		// NaN, infinities and more seconds than a Duration holds convert
		// to nonsense; ParseFloat takes them all.
		if math.IsNaN(secs) || math.Abs(secs) > math.MaxInt64/float64(time.Second) {
			return errors.New("want a duration such as 10s or a number of seconds")
		}
		d = time.Duration(secs * float64(time.Second))
	}
	if d < 0 {
		return errors.New("must not be negative")
	}
	*t = timeoutValue(d)
	return nil
}

var errHelp = errors.New("help")

// parseArgs parses flags and positional arguments in any order; "--" ends
// the flags (for text that starts with a dash).
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, errHelp
			}
			return nil, usageErr("%s: %v", fs.Name(), err)
		}
		rest := fs.Args()
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// command parses args against fs and checks the positional count.
func command(fs *flag.FlagSet, args []string, min, max int, synopsis string) ([]string, error) {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, err
	}
	if len(pos) < min || len(pos) > max {
		return nil, usageErr("usage: buzz %s", synopsis)
	}
	return pos, nil
}

// A commandFunc parses its arguments (flags included, so the timeout is
// known) and returns the action to run under that timeout. Input errors
// found while parsing mean nothing touches stdin or the network.
type commandFunc func(o *options, args []string) (action, error)

// An action does the command's work; a nil result means it wrote its own
// output (req --stream).
type action func(ctx context.Context) (any, error)

var commands = map[string]commandFunc{
	"channels list":   channelsList,
	"channels create": channelsCreate,
	"channels join":   channelsJoin,
	"send":            send,
	"req":             req,
	"whoami":          whoami,
	"keygen":          keygen,

	"workflows list":    workflowsList,
	"workflows show":    workflowsShow,
	"workflows runs":    workflowsRuns,
	"workflows trigger": workflowsTrigger,
	"workflows approve": workflowsDecide(kindApprovalGrant, "approve"),
	"workflows deny":    workflowsDecide(kindApprovalDeny, "deny"),

	"users get": usersGet,
}

// dispatch resolves the command (global flags may precede it), applies the
// timeout and runs it. A nil result means the command wrote its own output.
func dispatch(ctx context.Context, o *options, args []string) (any, error) {
	fs := o.flags("buzz")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return helpResult(), nil
		}
		return nil, usageErr("%v", err)
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return nil, usageErr("missing command; run buzz help")
	}
	name, rest := rest[0], rest[1:]
	if name == "help" {
		return helpResult(), nil
	}
	if name == "channels" || name == "workflows" || name == "users" {
		group := name
		fs := o.flags("buzz " + group)
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return helpResult(), nil
			}
			return nil, usageErr("%v", err)
		}
		if fs.NArg() == 0 {
			if group == "workflows" {
				return nil, usageErr("missing workflows subcommand: list, show, runs, trigger, approve or deny")
			}
			if group == "users" {
				return nil, usageErr("missing users subcommand: get")
			}
			return nil, usageErr("missing channels subcommand: list, create or join")
		}
		name, rest = group+" "+fs.Arg(0), fs.Args()[1:]
	}
	cmd, ok := commands[name]
	if !ok {
		return nil, usageErr("unknown command %q; run buzz help", name)
	}
	act, err := cmd(o, rest)
	if errors.Is(err, errHelp) {
		return helpResult(), nil
	}
	if err != nil {
		return nil, err
	}
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	result, err := act(ctx)
	var ce *cliError
	var re *RelayError
	if err != nil && ctx.Err() != nil && !errors.As(err, &ce) && !errors.As(err, &re) {
		// However the library words it, the cause is the timeout or a signal.
		code, msg := "timeout", fmt.Sprintf("timed out after %s", o.timeout)
		if errors.Is(context.Cause(ctx), context.Canceled) {
			code, msg = "interrupted", "interrupted"
		}
		return nil, &cliError{code: code, msg: msg + ": " + err.Error(), exit: 1}
	}
	return result, err
}

func helpResult() any { return map[string]string{"usage": usageText} }

// secretKey reads the key from --key-file or BUZZ_PRIVATE_KEY.
func (o *options) secretKey() (*nostr.SecretKey, error) {
	src, hexKey := "BUZZ_PRIVATE_KEY", o.env("BUZZ_PRIVATE_KEY")
	if o.keyFile != "" {
		// The path is never echoed: a key pasted where its path belongs
		// would otherwise end up in the error JSON (and the agent's logs).
		b, err := os.ReadFile(o.keyFile)
		var pathErr *fs.PathError
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil, configErr("--key-file: key file not found (give the path of a file holding the key, not the key)")
		case errors.As(err, &pathErr):
			return nil, configErr("--key-file: cannot read the key file: %v", pathErr.Err)
		case err != nil:
			return nil, configErr("--key-file: cannot read the key file")
		}
		src, hexKey = "--key-file", string(b)
	}
	hexKey = strings.TrimSpace(hexKey)
	if hexKey == "" {
		return nil, configErr("BUZZ_PRIVATE_KEY is not set (a 64-hex secret key; buzz keygen makes one)")
	}
	key, err := nostr.SecretKeyFromHex(hexKey)
	if err != nil {
		return nil, configErr("%s: %v", src, err)
	}
	return key, nil
}

// relayURL reads --relay or BUZZ_RELAY_URL, checks it is a WebSocket URL
// and returns it with a lower-case scheme.
func (o *options) relayURL() (string, error) {
	raw := o.relay
	if raw == "" {
		raw = o.env("BUZZ_RELAY_URL")
	}
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return "", configErr("BUZZ_RELAY_URL is not set (for example ws://localhost:3000)")
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		// The value is not echoed, as a --key-file path is not: a secret
		// key pasted here would end up in the error JSON. The scheme says
		// what is wrong without it.
		what := "the relay URL has no ws:// or wss:// scheme"
		if err == nil && u.Scheme != "" && u.Host != "" {
			what = fmt.Sprintf("the relay URL has scheme %q", u.Scheme)
		} else if err == nil && u.Host == "" && (u.Scheme == "ws" || u.Scheme == "wss") {
			what = "the relay URL has no host"
		}
		return "", configErr("%s; it must be ws://HOST[:PORT] or wss://HOST[:PORT]", what)
	}
	// url.Parse lowercased the scheme; the rest is kept as written. Every
	// use (the AUTH relay tag, the http(s) URL of the HTTP commands) then
	// sees one spelling.
	return u.Scheme + raw[len(u.Scheme):], nil
}

// connect reads the configuration, dials and authenticates.
func (o *options) connect(ctx context.Context) (*Client, error) {
	key, err := o.secretKey()
	if err != nil {
		return nil, err
	}
	relay, err := o.relayURL()
	if err != nil {
		return nil, err
	}
	tag, err := o.authTag()
	if err != nil {
		return nil, err
	}
	return Dial(ctx, relay, key, tag)
}

// authTag is the agent's owner attestation from BUZZ_AUTH_TAG (a NIP-OA
// auth tag as a JSON array), or nil when unset. It rides on AUTH and, as
// X-Auth-Tag, on signed HTTP requests, so the relay records the owner
// whichever the CLI talks to first. A malformed value stops the command.
func (o *options) authTag() (*nipoa.Attestation, error) {
	raw := strings.TrimSpace(o.env("BUZZ_AUTH_TAG"))
	if raw == "" {
		return nil, nil
	}
	att, err := nipoa.ParseHeader(raw)
	if err != nil {
		return nil, configErr("BUZZ_AUTH_TAG: %v", err)
	}
	return att, nil
}
