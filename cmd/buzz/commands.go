package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// NIP-29 kinds used by the CLI.
const (
	kindChat          = 9
	kindCreateGroup   = 9007
	kindJoinRequest   = 9021
	kindGroupMetadata = 39000
)

type channelJSON struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	About      string `json:"about"`
	Visibility string `json:"visibility"`
}

// channelsList reads the relay-signed NIP-29 metadata (kind 39000), one
// event per channel, and prints the channels sorted by name.
func channelsList(o *options, args []string) (action, error) {
	if _, err := command(o.flags("buzz channels list"), args, 0, 0, "channels list"); err != nil {
		return nil, err
	}
	return func(ctx context.Context) (any, error) { return listChannels(ctx, o) }, nil
}

func listChannels(ctx context.Context, o *options) ([]channelJSON, error) {
	c, err := o.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close(ctx)
	events, err := c.Query(ctx, []json.RawMessage{json.RawMessage(`{"kinds":[39000]}`)})
	if err != nil {
		return nil, err
	}
	latest := map[string]*nostr.Event{}
	for _, r := range events {
		ev := r.Event
		id := ev.DTag()
		if ev.Kind != kindGroupMetadata || id == "" {
			continue
		}
		if prev := latest[id]; prev == nil || ev.CreatedAt > prev.CreatedAt {
			latest[id] = ev
		}
	}
	channels := make([]channelJSON, 0, len(latest))
	for id, ev := range latest {
		ch := channelJSON{ID: id, Visibility: "open"}
		if t := ev.Tags.First("name"); t != nil {
			ch.Name = t[1]
		}
		if t := ev.Tags.First("about"); t != nil {
			ch.About = t[1]
		}
		if hasTag(ev.Tags, "private") {
			ch.Visibility = "private"
		}
		channels = append(channels, ch)
	}
	sort.Slice(channels, func(i, j int) bool {
		if channels[i].Name != channels[j].Name {
			return channels[i].Name < channels[j].Name
		}
		return channels[i].ID < channels[j].ID
	})
	return channels, nil
}

// hasTag reports a tag named name, with or without values (NIP-29 flags
// such as ["private"] have none).
func hasTag(tags nostr.Tags, name string) bool {
	for _, t := range tags {
		if len(t) > 0 && t[0] == name {
			return true
		}
	}
	return false
}

// channelsCreate publishes kind 9007 for a new channel id.
func channelsCreate(o *options, args []string) (action, error) {
	fs := o.flags("buzz channels create")
	private := fs.Bool("private", false, "only members may read and write")
	about := fs.String("about", "", "channel description")
	pos, err := command(fs, args, 1, 1, "channels create NAME [--private] [--about TEXT]")
	if err != nil {
		return nil, err
	}
	name := pos[0]
	if name == "" || len(name) > 255 {
		return nil, invalidErr("channel name must be 1 to 255 bytes")
	}
	visibility := "open"
	if *private {
		visibility = "private"
	}
	id := uuid.New().String()
	tags := nostr.Tags{{"h", id}, {"name", name}}
	if *about != "" {
		tags = append(tags, nostr.Tag{"about", *about})
	}
	tags = append(tags, nostr.Tag{"visibility", visibility})
	return func(ctx context.Context) (any, error) {
		p, err := publish(ctx, o, kindCreateGroup, "", tags, false)
		if err != nil {
			return nil, err
		}
		return struct {
			ID         string `json:"id"`
			Name       string `json:"name"`
			Visibility string `json:"visibility"`
			EventID    string `json:"event_id"`
		}{id, name, visibility, p.ev.ID}, nil
	}, nil
}

// channelsJoin publishes a kind 9021 join request.
func channelsJoin(o *options, args []string) (action, error) {
	pos, err := command(o.flags("buzz channels join"), args, 1, 1, "channels join CHANNEL_ID")
	if err != nil {
		return nil, err
	}
	id, err := channelID(pos[0])
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (any, error) {
		// A join repeated within a second asks for the same thing; the
		// relay's duplicate answer is reported rather than signed around.
		p, err := publish(ctx, o, kindJoinRequest, "", nostr.Tags{{"h", id}}, false)
		if err != nil {
			return nil, err
		}
		return joinedJSON{Channel: id, EventID: p.ev.ID, Duplicate: p.duplicate, Message: duplicateMessage(p)}, nil
	}, nil
}

// sendInput is the stdin form of send; unknown fields are errors so a typo
// never silently drops part of a message.
type sendInput struct {
	Channel  string     `json:"channel"`
	Content  string     `json:"content"`
	Tags     [][]string `json:"tags"`
	ReplyTo  string     `json:"reply_to"`
	Mentions []string   `json:"mentions"`
}

// sentJSON is what send prints. Duplicate (with the relay's Message) is
// set only when the relay stored nothing new, which a send avoids by
// re-signing (see publish), so an agent never loses a message silently.
type sentJSON struct {
	ID        string `json:"id"`
	Channel   string `json:"channel"`
	CreatedAt int64  `json:"created_at"`
	Duplicate bool   `json:"duplicate,omitempty"`
	Message   string `json:"message,omitempty"`
}

// joinedJSON is what channels join prints.
type joinedJSON struct {
	Channel   string `json:"channel"`
	EventID   string `json:"event_id"`
	Duplicate bool   `json:"duplicate,omitempty"`
	Message   string `json:"message,omitempty"`
}

// duplicateMessage is the relay's OK message when it reported a duplicate.
func duplicateMessage(p *published) string {
	if p.duplicate {
		return p.msg
	}
	return ""
}

// send publishes a kind 9 chat message to a channel.
func send(o *options, args []string) (action, error) {
	const synopsis = "send CHANNEL_ID TEXT [--reply-to EVENT_ID] [--mention PUBKEY]... | send --json < {\"channel\":...,\"content\":...}"
	fs := o.flags("buzz send")
	fromStdin := fs.Bool("json", false, "read the message as a JSON object from stdin")
	replyTo := fs.String("reply-to", "", "id of the event this replies to")
	var mentions stringList
	fs.Var(&mentions, "mention", "pubkey to mention (repeatable)")
	pos, err := command(fs, args, 0, 2, synopsis)
	if err != nil {
		return nil, err
	}
	jsonIn := *fromStdin || (len(pos) == 1 && pos[0] == "-")
	switch {
	case jsonIn && len(pos) > 0 && pos[0] != "-":
		return nil, usageErr("send --json takes no arguments; usage: buzz %s", synopsis)
	case !jsonIn && len(pos) != 2:
		return nil, usageErr("usage: buzz %s", synopsis)
	}
	return func(ctx context.Context) (any, error) {
		var in sendInput
		if jsonIn {
			data, err := readStdin(ctx, o.stdin)
			if err != nil {
				return nil, err
			}
			if err := decodeStrict(data, &in); err != nil {
				return nil, invalidErr("stdin: %v", err)
			}
		} else {
			in.Channel, in.Content = pos[0], pos[1]
		}
		return sendMessage(ctx, o, in, *replyTo, mentions)
	}, nil
}

// sendMessage validates a message, then publishes it.
func sendMessage(ctx context.Context, o *options, in sendInput, replyTo string, mentions []string) (any, error) {
	if replyTo != "" {
		if in.ReplyTo != "" && in.ReplyTo != replyTo {
			return nil, usageErr("--reply-to and the JSON reply_to disagree")
		}
		in.ReplyTo = replyTo
	}
	in.Mentions = append(in.Mentions, mentions...)

	channel, err := channelID(in.Channel)
	if err != nil {
		return nil, err
	}
	if in.Content == "" {
		return nil, invalidErr("message content is empty")
	}
	tags := nostr.Tags{{"h", channel}}
	if in.ReplyTo != "" {
		if !nostr.IsHex64(in.ReplyTo) {
			return nil, invalidErr("reply-to must be an event id (64 lowercase hex)")
		}
		tags = append(tags, nostr.Tag{"e", in.ReplyTo, "", "reply"})
	}
	for _, p := range in.Mentions {
		if !nostr.IsHex64(p) {
			return nil, invalidErr("mention %q must be a pubkey (64 lowercase hex)", p)
		}
		tags = append(tags, nostr.Tag{"p", p})
	}
	for i, t := range in.Tags {
		if len(t) == 0 || t[0] == "" {
			return nil, invalidErr("tags[%d]: a tag needs a name", i)
		}
		if t[0] == "h" {
			return nil, invalidErr("tags[%d]: the h tag comes from channel; do not repeat it", i)
		}
		tags = append(tags, nostr.Tag(t))
	}
	p, err := publish(ctx, o, kindChat, in.Content, tags, true)
	if err != nil {
		return nil, err
	}
	return sentJSON{ID: p.ev.ID, Channel: channel, CreatedAt: p.ev.CreatedAt, Duplicate: p.duplicate, Message: duplicateMessage(p)}, nil
}

// req queries the relay: stored events up to EOSE (printed as one array),
// a COUNT, or a live stream printed one event per line.
func req(o *options, args []string) (action, error) {
	const synopsis = "req FILTER_JSON... [--count | --stream] | req --json < [FILTER,...]"
	fs := o.flags("buzz req")
	fromStdin := fs.Bool("json", false, "read a JSON array of filters from stdin")
	count := fs.Bool("count", false, "print {\"count\": n} (NIP-45) instead of the events")
	stream := fs.Bool("stream", false, "keep the subscription open; print one event per line until --timeout or SIGINT")
	pos, err := command(fs, args, 0, 1<<20, synopsis)
	if err != nil {
		return nil, err
	}
	if *count && *stream {
		return nil, usageErr("--count and --stream cannot be combined")
	}
	jsonIn := *fromStdin || (len(pos) == 1 && pos[0] == "-")
	var filters []json.RawMessage
	switch {
	case jsonIn && len(pos) > 0 && pos[0] != "-":
		return nil, usageErr("req --json takes no filter arguments; usage: buzz %s", synopsis)
	case jsonIn:
	case len(pos) > 0:
		for _, p := range pos {
			filters = append(filters, json.RawMessage(p))
		}
		if err := checkFilters(filters); err != nil {
			return nil, err
		}
	default:
		return nil, usageErr("usage: buzz %s", synopsis)
	}
	return func(ctx context.Context) (any, error) {
		if jsonIn {
			data, err := readStdin(ctx, o.stdin)
			if err != nil {
				return nil, err
			}
			if filters, err = stdinFilters(data); err != nil {
				return nil, err
			}
			if err := checkFilters(filters); err != nil {
				return nil, err
			}
		}
		return query(ctx, o, filters, *count, *stream)
	}, nil
}

// query runs validated filters as a one-shot REQ, a COUNT or a stream.
func query(ctx context.Context, o *options, filters []json.RawMessage, count, stream bool) (any, error) {
	c, err := o.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close(ctx)
	switch {
	case count:
		n, err := c.Count(ctx, filters)
		if err != nil {
			return nil, err
		}
		return n, nil
	case stream:
		var line bytes.Buffer
		err := c.Subscribe(ctx, filters, func(r Received) error {
			// Compacted as the one-shot output is: the relay's whitespace,
			// newlines included, must not split an event across lines.
			line.Reset()
			if err := json.Compact(&line, r.Raw); err != nil {
				return &ProtocolError{Msg: "relay sent an event that is not JSON: " + err.Error()}
			}
			line.WriteByte('\n')
			_, err := o.stdout.Write(line.Bytes())
			return err
		}, false)
		if ctx.Err() != nil {
			return nil, nil // the timeout or a signal ends a stream normally
		}
		return nil, err
	default:
		events, err := c.Query(ctx, filters)
		if err != nil {
			return nil, err
		}
		raws := make([]json.RawMessage, len(events))
		for i, r := range events {
			raws[i] = r.Raw
		}
		return raws, nil
	}
}

// stdinFilters accepts a JSON array of filters or a single filter object.
func stdinFilters(data []byte) ([]json.RawMessage, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) > 0 && trimmed[0] == '{' {
		return []json.RawMessage{trimmed}, nil
	}
	var filters []json.RawMessage
	if err := json.Unmarshal(trimmed, &filters); err != nil {
		return nil, invalidErr("stdin must hold a JSON array of filters or one filter object: %v", err)
	}
	return filters, nil
}

// checkFilters validates every filter with the relay's own strict parser
// and compacts it, so a typo is a clear local error rather than a CLOSED.
func checkFilters(filters []json.RawMessage) error {
	if len(filters) == 0 {
		return invalidErr("at least one filter is required")
	}
	for i, raw := range filters {
		var f nostr.Filter
		if err := f.UnmarshalJSON(raw); err != nil {
			return invalidErr("filter %d: %v", i+1, err)
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err != nil {
			return invalidErr("filter %d: %v", i+1, err)
		}
		filters[i] = buf.Bytes()
	}
	return nil
}

// whoami prints the configured key's pubkey without touching the network.
func whoami(o *options, args []string) (action, error) {
	if _, err := command(o.flags("buzz whoami"), args, 0, 0, "whoami"); err != nil {
		return nil, err
	}
	key, err := o.secretKey()
	if err != nil {
		return nil, err
	}
	return done(map[string]string{"pubkey": key.PublicKeyHex()}), nil
}

// keygen prints a fresh key pair.
func keygen(o *options, args []string) (action, error) {
	if _, err := command(o.flags("buzz keygen"), args, 0, 0, "keygen"); err != nil {
		return nil, err
	}
	key, err := nostr.GenerateSecretKey()
	if err != nil {
		return nil, err
	}
	return done(struct {
		SecretKey string `json:"secret_key"`
		PubKey    string `json:"pubkey"`
	}{key.Hex(), key.PublicKeyHex()}), nil
}

// done is an action whose result is already known.
func done(v any) action {
	return func(context.Context) (any, error) { return v, nil }
}

// maxResigns bounds how often a distinct publish moves created_at forward.
// Each step is one second, well inside the relay's future skew.
const maxResigns = 8

// published is an event the relay accepted: msg is its OK message, and
// duplicate says the relay already held this very event (and stored
// nothing new).
type published struct {
	ev        *nostr.Event
	msg       string
	duplicate bool
}

// publish connects, signs an event of kind with the configured key and
// waits for the relay's OK. With distinct, every call is a new event: the
// same kind, content and tags signed within one second have the same id,
// so when the relay answers "duplicate:" the event moves one second
// forward and is signed again (at most maxResigns times; then it is
// reported as a duplicate). Without distinct a duplicate is reported as is.
func publish(ctx context.Context, o *options, kind int, content string, tags nostr.Tags, distinct bool) (*published, error) {
	c, err := o.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close(ctx)
	ev := &nostr.Event{Kind: kind, Content: content, Tags: tags, CreatedAt: time.Now().Unix()}
	for resigns := 0; ; resigns++ {
		if err := c.Sign(ev); err != nil {
			return nil, err
		}
		msg, err := c.Publish(ctx, ev)
		if err != nil {
			return nil, err
		}
		duplicate := strings.HasPrefix(msg, "duplicate:")
		if !duplicate || !distinct || resigns == maxResigns {
			return &published{ev: ev, msg: msg, duplicate: duplicate}, nil
		}
		ev.CreatedAt++
	}
}

// channelID checks a channel id and returns its canonical lowercase form,
// the only spelling the relay accepts in an h tag.
func channelID(s string) (string, error) {
	if s == "" {
		return "", invalidErr("channel id is required")
	}
	id, err := uuid.Parse(s)
	if err != nil || len(s) != 36 {
		return "", invalidErr("channel id %q must be a UUID", s)
	}
	return id.String(), nil
}

// decodeStrict decodes exactly one JSON value into v, refusing unknown fields.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("more than one JSON value")
	}
	return nil
}

// readStdin reads all of stdin, giving up when ctx ends (a caller that
// forgot to close stdin gets a timeout, not a hang).
func readStdin(ctx context.Context, r io.Reader) ([]byte, error) {
	type result struct {
		data []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		data, err := io.ReadAll(r)
		done <- result{data, err}
	}()
	select {
	case res := <-done:
		if res.err != nil {
			return nil, fmt.Errorf("read stdin: %w", res.err)
		}
		return res.data, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for stdin to close: %w", context.Cause(ctx))
	}
}

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string { return strings.Join(*s, ",") }

func (s *stringList) Set(v string) error {
	*s = append(*s, v)
	return nil
}
