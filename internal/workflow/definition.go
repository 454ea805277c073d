// Package workflow holds workflow definitions (the YAML an owner signs in a
// kind 30620 event), their materialization into the workflows table, run
// creation from triggering events, and the durable run engine.
package workflow

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/lexer"
	"github.com/goccy/go-yaml/token"
	"github.com/google/uuid"
	"github.com/robfig/cron/v3"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow/condition"
	"github.com/buzzrelay/buzz/internal/workflow/template"
)

// Trigger kinds (the trigger's `on` key).
const (
	OnMessagePosted = "message_posted"
	OnReactionAdded = "reaction_added"
	OnDiffPosted    = "diff_posted"
	OnSchedule      = "schedule"
	OnWebhook       = "webhook"
)

// Step actions (the step's `action` key).
const (
	ActionSendMessage     = "send_message"
	ActionAddReaction     = "add_reaction"
	ActionCallWebhook     = "call_webhook"
	ActionRequestApproval = "request_approval"
	ActionDelay           = "delay"
	ActionSendDM          = "send_dm"
	ActionSetChannelTopic = "set_channel_topic"
)

// Definition limits. They bound what one signed definition may ask the
// relay to do; they are part of the definition language, not tuning knobs.
const (
	MaxStepIDLength   = 64
	MaxNameLength     = 255 // the workflows.name column
	MaxConditionBytes = 4096
	MaxDelay          = 300 * time.Second
	// MaxStepTimeoutSecs caps a step's timeout_secs. A step holds a worker
	// slot, and a call_webhook its run's lease, for up to its timeout; a
	// worker that dies mid-call leaves its run waiting that long before
	// another fails it. Ten minutes is twice the default and far above what
	// a step's database work or one HTTP call should need.
	MaxStepTimeoutSecs = 600
	// MinScheduleInterval is the default shortest time between two slots
	// of a schedule saved: an interval at least this long, a cron
	// expression that never fires twice within it. Every slot is a run and
	// a row kept for the retention, each step a stored event: a per-second
	// schedule made 86,400 of each a day, per workflow.
	MinScheduleInterval  = 60 * time.Second
	DefaultApprovalLimit = "24h"
	// MaxApprovalTimeout caps a request_approval's timeout: the run waits,
	// unfinished, that long (it counts against the workflow's unfinished-run
	// bound and is never pruned), and a forgotten approval should end in a
	// week, not in the 292 years a Go duration can name.
	MaxApprovalTimeout = 7 * 24 * time.Hour
	// MaxNesting bounds how deeply the YAML text nests collections. The
	// YAML parser's time grows faster than linearly with nesting (64 KiB
	// of "[" took it 26 s), and a definition is parsed while its event
	// is being stored; a real definition nests fewer than ten levels.
	MaxNesting = 32
	// MaxSteps bounds a definition's steps: each may make the relay sign
	// and store an event, once per run.
	MaxSteps = 50
)

// Definition is a validated workflow definition. Its JSON encoding is the
// canonical form stored in workflows.definition: Parse of that JSON (JSON is
// YAML) gives the same Definition back.
type Definition struct {
	Name        string  `json:"name"`
	Description string  `json:"description,omitempty"`
	Enabled     bool    `json:"enabled"`
	Trigger     Trigger `json:"trigger"`
	Steps       []Step  `json:"steps"`
	// WebhookSecret is added by the relay when a webhook-triggered
	// definition is saved; never part of what the owner signs.
	WebhookSecret string `json:"_webhook_secret,omitempty"`
}

// Trigger says what starts a run.
type Trigger struct {
	On     string `json:"on"`
	Filter string `json:"filter,omitempty"`
	Emoji  string `json:"emoji,omitempty"`
	// Cron is normalized to seven fields: seconds, minutes, hours, day of
	// month, month, day of week, year.
	Cron     string `json:"cron,omitempty"`
	Interval string `json:"interval,omitempty"`
}

// Step is one action of a workflow. Only the fields of its Action are set.
type Step struct {
	ID          string   `json:"id"`
	Name        string   `json:"name,omitempty"`
	If          string   `json:"if,omitempty"`
	TimeoutSecs int      `json:"timeout_secs,omitempty"`
	DependsOn   []string `json:"depends_on,omitempty"`
	Action      string   `json:"action"`

	Text          string            `json:"text,omitempty"`            // send_message, send_dm
	Channel       string            `json:"channel,omitempty"`         // send_message
	ReplyInThread bool              `json:"reply_in_thread,omitempty"` // send_message
	Emoji         string            `json:"emoji,omitempty"`           // add_reaction
	URL           string            `json:"url,omitempty"`             // call_webhook
	Method        string            `json:"method,omitempty"`          // call_webhook
	Headers       map[string]string `json:"headers,omitempty"`         // call_webhook
	Body          string            `json:"body,omitempty"`            // call_webhook
	From          string            `json:"from,omitempty"`            // request_approval
	Message       string            `json:"message,omitempty"`         // request_approval
	Timeout       string            `json:"timeout,omitempty"`         // request_approval
	Duration      string            `json:"duration,omitempty"`        // delay
	To            string            `json:"to,omitempty"`              // send_dm
	Topic         string            `json:"topic,omitempty"`           // set_channel_topic
}

// DelayDuration is a delay step's duration (validated by Parse).
func (s Step) DelayDuration() time.Duration {
	d, _ := time.ParseDuration(s.Duration)
	return d
}

// IntervalDuration is a schedule trigger's interval (zero for cron).
func (t Trigger) IntervalDuration() time.Duration {
	d, _ := time.ParseDuration(t.Interval)
	return d
}

// ErrInvalid marks every definition error; its text names the field.
var ErrInvalid = errors.New("invalid workflow definition")

// DefinitionError is a definition Parse refused.
type DefinitionError struct {
	// Text is "invalid YAML: ..." or "invalid definition: <field>: ...".
	Text string
}

func (e *DefinitionError) Error() string { return e.Text }
func (e *DefinitionError) Unwrap() error { return ErrInvalid }

func invalidf(field, format string, args ...any) error {
	return &DefinitionError{Text: "invalid definition: " + field + ": " + fmt.Sprintf(format, args...)}
}

// checkName is the rule of a workflow's name (the column's): not blank, at
// most MaxNameLength bytes. field names where it came from.
func checkName(name, field string) error {
	if strings.TrimSpace(name) == "" {
		return invalidf(field, "must not be blank")
	}
	if len(name) > MaxNameLength {
		return invalidf(field, "must be at most %d bytes", MaxNameLength)
	}
	return nil
}

var stepIDPattern = regexp.MustCompile(`^[A-Za-z0-9_]+$`)

// ParseForSave is Parse with the bounds a definition must meet when it is
// saved, beyond what Parse checks. Parse keeps accepting a definition
// stored before a bound was added (a run executes it with the value
// clamped, and an agent verifying a doorbell reads it).
func ParseForSave(text string) (*Definition, error) {
	def, err := Parse(text)
	if err != nil {
		return nil, err
	}
	if err := checkForSave(def, MinScheduleInterval); err != nil {
		return nil, err
	}
	return def, nil
}

// checkForSave checks the bounds of ParseForSave on a parsed definition,
// with minSchedule the shortest time a schedule may leave between two
// slots.
func checkForSave(def *Definition, minSchedule time.Duration) error {
	if err := checkScheduleGap(def.Trigger, minSchedule); err != nil {
		return err
	}
	for i, s := range def.Steps {
		switch s.Action {
		case ActionRequestApproval:
			if d, _ := time.ParseDuration(s.Timeout); d > MaxApprovalTimeout {
				return invalidf(fmt.Sprintf("steps[%d].timeout", i), "must be at most %s (7 days), got %s", approvalTimeoutText, s.Timeout)
			}
		case ActionCallWebhook:
			if !urlOriginIsLiteral(s.URL) {
				return invalidf(fmt.Sprintf("steps[%d].url", i), "%s", urlOriginPlaceholder)
			}
		}
	}
	return nil
}

const urlOriginPlaceholder = "a placeholder may not stand in the scheme, host or port; write them out, as in https://api.example.com/items/{{trigger.text}}"

// urlOriginIsLiteral reports whether a call_webhook URL template writes out
// its scheme, host and port: every placeholder comes after the first "/",
// "?" or "#" past "://". Whoever fills a placeholder (any member who posts,
// for a message trigger) must not choose the server that gets the owner's
// headers: "https://api.example.com{{trigger.text}}" goes to another
// domain with ".evil.example", to another port with ":8443".
func urlOriginIsLiteral(url string) bool {
	at := strings.Index(url, "{{")
	if at < 0 {
		return true
	}
	_, rest, ok := strings.Cut(url[:at], "://")
	return ok && strings.ContainsAny(rest, "/?#")
}

// maxCachedDefinitionBytes bounds the definition text a definitionCache
// keeps (its parsed definitions take about as much again): hundreds of
// typical definitions, and 32 of the largest an event may hold. Past it
// the cache starts again empty, which only costs parsing again.
const maxCachedDefinitionBytes = 8 << 20

// definitionCache keeps definitions parsed from signed definition events,
// by event id. Every step of a run reads its pinned definition again, and
// parsing it (the YAML, every if compiled to check it) cost a step about
// as much as the rest of its work: 8 ms for 50 steps with 200-byte ifs, so
// 0.4 s of CPU per such run (BenchmarkFiftyStepRun); a save parsed its
// definition before its transaction and again inside it, under the
// channel's workflow lock. An event's id is the hash of its content, so
// one id parses to one definition; the content is compared all the same,
// which costs nothing next to parsing. The definitions are shared and
// never modified. A definition that does not parse is not kept.
type definitionCache struct {
	mu     sync.Mutex
	parsed map[[32]byte]parsedDefinition
	bytes  int // the content kept
	hits   int // parses answered from the cache (tests read it)
}

type parsedDefinition struct {
	content string
	def     *Definition
}

func newDefinitionCache() *definitionCache {
	return &definitionCache{parsed: map[[32]byte]parsedDefinition{}}
}

// parse is Parse of content, the content of the event eventID.
func (c *definitionCache) parse(eventID []byte, content string) (*Definition, error) {
	if len(eventID) != 32 {
		return Parse(content)
	}
	key := [32]byte(eventID)
	c.mu.Lock()
	kept, found := c.parsed[key]
	found = found && kept.content == content
	if found {
		c.hits++
	}
	c.mu.Unlock()
	if found {
		return kept.def, nil
	}
	def, err := Parse(content)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.bytes+len(content) > maxCachedDefinitionBytes {
		clear(c.parsed)
		c.bytes = 0
	}
	if old, ok := c.parsed[key]; ok {
		c.bytes -= len(old.content)
	}
	c.parsed[key] = parsedDefinition{content: content, def: def}
	c.bytes += len(content)
	c.mu.Unlock()
	return def, nil
}

// parseEvent is parse of a signed event's content (its id in hex).
func (c *definitionCache) parseEvent(ev *nostr.Event) (*Definition, error) {
	id, ok := nostr.DecodeHex32(ev.ID)
	if !ok {
		return Parse(ev.Content)
	}
	return c.parse(id[:], ev.Content)
}

// approvalTimeoutText is MaxApprovalTimeout as a definition would write it.
const approvalTimeoutText = "168h"

// Parse parses and validates a definition's YAML text.
func Parse(text string) (*Definition, error) {
	if err := checkNesting(text); err != nil {
		return nil, err
	}
	var raw any
	if err := yaml.Unmarshal([]byte(text), &raw); err != nil {
		return nil, &DefinitionError{Text: "invalid YAML: " + firstLine(err.Error())}
	}
	top, ok := raw.(map[string]any)
	if !ok {
		return nil, invalidf("(top level)", "must be a mapping")
	}
	def := &Definition{Enabled: true}
	var err error
	if def.Name, err = requiredString(top, "name", "name"); err != nil {
		return nil, err
	}
	if err := checkName(def.Name, "name"); err != nil {
		return nil, err
	}
	if def.Description, err = optionalString(top, "description", "description"); err != nil {
		return nil, err
	}
	if v, present := top["enabled"]; present {
		b, ok := v.(bool)
		if !ok {
			return nil, invalidf("enabled", "must be true or false")
		}
		def.Enabled = b
	}
	if def.Trigger, err = parseTrigger(top["trigger"]); err != nil {
		return nil, err
	}
	if def.Steps, err = parseSteps(top["steps"], def.Trigger.On); err != nil {
		return nil, err
	}
	return def, nil
}

// checkNesting refuses text that nests collections deeper than MaxNesting,
// before the YAML parser sees it. It reads the tokens of the parser's own
// lexer (linear in the text), so a bracket inside a quoted string is not
// counted and a bracket the parser would see always is. The depth it
// measures is an upper bound of the parser's: open flow collections ([ {),
// plus the block levels of the line (one per indentation level the line
// is under, one per "-" or "?" entry on the line), so "- - - x" counts.
func checkNesting(text string) error {
	var indents []int // columns of the lines the current line is indented under
	flow, line, entries := 0, 0, 0
	for _, tk := range lexer.Tokenize(text) {
		if tk.Type == token.CommentType || tk.Position == nil {
			continue
		}
		if flow == 0 && tk.Position.Line != line {
			line, entries = tk.Position.Line, 0
			for len(indents) > 0 && indents[len(indents)-1] >= tk.Position.Column {
				indents = indents[:len(indents)-1]
			}
			indents = append(indents, tk.Position.Column)
		}
		switch tk.Type {
		case token.SequenceStartType, token.MappingStartType:
			flow++
		case token.SequenceEndType, token.MappingEndType:
			if flow > 0 {
				flow--
			}
		case token.SequenceEntryType, token.MappingKeyType:
			if flow == 0 {
				entries++
			}
		}
		if len(indents)+entries+flow > MaxNesting {
			return &DefinitionError{Text: fmt.Sprintf("invalid YAML: nested deeper than %d levels (line %d)", MaxNesting, tk.Position.Line)}
		}
	}
	return nil
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func requiredString(m map[string]any, key, field string) (string, error) {
	v, present := m[key]
	if !present || v == nil {
		return "", invalidf(field, "is required")
	}
	s, ok := v.(string)
	if !ok {
		return "", invalidf(field, "must be a string")
	}
	return s, nil
}

func optionalString(m map[string]any, key, field string) (string, error) {
	v, present := m[key]
	if !present || v == nil {
		return "", nil
	}
	s, ok := v.(string)
	if !ok {
		return "", invalidf(field, "must be a string")
	}
	return s, nil
}

func nonBlankString(m map[string]any, key, field string) (string, error) {
	s, err := requiredString(m, key, field)
	if err == nil && strings.TrimSpace(s) == "" {
		err = invalidf(field, "must not be blank")
	}
	return s, err
}

func optionalCondition(m map[string]any, key, field string) (string, error) {
	s, err := optionalString(m, key, field)
	if err == nil && len(s) > MaxConditionBytes {
		err = invalidf(field, "expression longer than %d bytes", MaxConditionBytes)
	}
	if err == nil && s != "" {
		if _, cerr := condition.Compile(s); cerr != nil {
			err = invalidf(field, "%v", cerr)
		}
	}
	return s, err
}

// checkTemplates refuses a step text whose placeholders cannot render
// (an unknown filter, a bad filter argument), at save time rather than at
// the first run.
func checkTemplates(s *Step, field string) error {
	for key, text := range map[string]string{
		"text": s.Text, "channel": s.Channel, "emoji": s.Emoji, "url": s.URL, "body": s.Body, "message": s.Message,
	} {
		if err := template.Validate(text); err != nil {
			return invalidf(field+"."+key, "%v", err)
		}
	}
	for k, v := range s.Headers {
		if err := template.Validate(v); err != nil {
			return invalidf(field+".headers", "value of %q: %v", k, err)
		}
	}
	return nil
}

func parseTrigger(v any) (Trigger, error) {
	m, ok := v.(map[string]any)
	if !ok {
		if v == nil {
			return Trigger{}, invalidf("trigger", "is required")
		}
		return Trigger{}, invalidf("trigger", "must be a mapping")
	}
	var t Trigger
	var err error
	if t.On, err = requiredString(m, "on", "trigger.on"); err != nil {
		return t, err
	}
	switch t.On {
	case OnMessagePosted, OnDiffPosted:
		t.Filter, err = optionalCondition(m, "filter", "trigger.filter")
	case OnReactionAdded:
		if t.Emoji, err = optionalString(m, "emoji", "trigger.emoji"); err != nil {
			return t, err
		}
		t.Filter, err = optionalCondition(m, "filter", "trigger.filter")
	case OnSchedule:
		if t.Cron, err = optionalString(m, "cron", "trigger.cron"); err != nil {
			return t, err
		}
		if t.Interval, err = optionalString(m, "interval", "trigger.interval"); err != nil {
			return t, err
		}
		switch {
		case t.Cron == "" && t.Interval == "":
			return t, invalidf("trigger", "a schedule needs exactly one of cron or interval, got neither")
		case t.Cron != "" && t.Interval != "":
			return t, invalidf("trigger", "a schedule needs exactly one of cron or interval, got both")
		case t.Cron != "":
			t.Cron, err = NormalizeCron(t.Cron)
		default:
			err = checkInterval(t.Interval)
		}
	case OnWebhook:
	default:
		return t, invalidf("trigger.on", "unknown trigger %q (want message_posted, reaction_added, diff_posted, schedule or webhook)", t.On)
	}
	return t, err
}

func checkInterval(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return invalidf("trigger.interval", "not a duration like 60s, 30m or 1h")
	}
	if d < time.Second {
		return invalidf("trigger.interval", "must be at least 1s")
	}
	if d%time.Second != 0 {
		return invalidf("trigger.interval", "must be a whole number of seconds")
	}
	return nil
}

// checkScheduleGap refuses a schedule whose slots may come closer than
// minSchedule: an interval shorter than it, or a cron expression firing
// twice within it (a cron expression needs at most a minute: one naming a
// single second fires at most once a minute).
func checkScheduleGap(t Trigger, minSchedule time.Duration) error {
	switch {
	case t.On != OnSchedule:
	case t.Interval != "":
		if t.IntervalDuration() < minSchedule {
			return invalidf("trigger.interval", "must be at least %s", minSchedule)
		}
	case t.Cron != "":
		sched, err := CronSchedule(t.Cron)
		if err != nil {
			return invalidf("trigger.cron", "%v", err)
		}
		spec, ok := sched.(*cron.SpecSchedule)
		if !ok {
			return invalidf("trigger.cron", "not a cron expression")
		}
		if gap := cronGap(spec); gap < min(minSchedule, time.Minute) {
			return invalidf("trigger.cron", "fires every %s; a schedule fires at most once every %s (name one second in the seconds field, or write 5 fields)",
				gap, min(minSchedule, time.Minute))
		}
	}
	return nil
}

// cronGap is the shortest time between two slots of spec, or a minute if
// it is a minute or more: the seconds it names within a minute, and from
// the last of one minute to the first of the next when two consecutive
// minutes may fire.
func cronGap(spec *cron.SpecSchedule) time.Duration {
	var seconds []int
	for s := range 60 {
		if spec.Second&(1<<s) != 0 {
			seconds = append(seconds, s)
		}
	}
	gap := 60
	for i := 1; i < len(seconds); i++ {
		gap = min(gap, seconds[i]-seconds[i-1])
	}
	consecutive := false
	for m := range 60 {
		if spec.Minute&(1<<m) != 0 && spec.Minute&(1<<((m+1)%60)) != 0 {
			consecutive = true
		}
	}
	if consecutive && len(seconds) > 0 {
		gap = min(gap, 60-seconds[len(seconds)-1]+seconds[0])
	}
	return time.Duration(gap) * time.Second
}

// cronParser parses the six leading fields (seconds through day of week)
// of a normalized expression; the cron library has no year field, so
// NormalizeCron accepts only "*" there.
var cronParser = cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow)

// NormalizeCron turns a 5-field (minute-based), 6-field (with seconds) or
// 7-field (with seconds and year) UTC cron expression into its 7-field
// form and checks that it parses. The year field must be "*".
func NormalizeCron(expr string) (string, error) {
	fields := strings.Fields(expr)
	switch len(fields) {
	case 5:
		fields = append(append([]string{"0"}, fields...), "*")
	case 6:
		fields = append(fields, "*")
	case 7:
	default:
		return "", invalidf("trigger.cron", "want 5, 6 or 7 fields, got %d", len(fields))
	}
	if fields[6] != "*" {
		return "", invalidf("trigger.cron", "the year field must be *")
	}
	sched, err := cronParser.Parse(strings.Join(fields[:6], " "))
	if err != nil {
		return "", invalidf("trigger.cron", "%v", err)
	}
	// The cron library gives up after five years and answers the zero
	// time; an expression naming no real date (30 February) never fires.
	if sched.Next(time.Now().UTC()).IsZero() {
		return "", invalidf("trigger.cron", "names no date that occurs (the next five years have none)")
	}
	return strings.Join(fields, " "), nil
}

// CronSchedule returns the schedule of a normalized cron expression.
func CronSchedule(normalized string) (cron.Schedule, error) {
	fields := strings.Fields(normalized)
	if len(fields) != 7 {
		return nil, fmt.Errorf("cron %q is not normalized", normalized)
	}
	return cronParser.Parse(strings.Join(fields[:6], " "))
}

func parseSteps(v any, on string) ([]Step, error) {
	list, ok := v.([]any)
	if !ok {
		if v == nil {
			return nil, invalidf("steps", "is required")
		}
		return nil, invalidf("steps", "must be a list")
	}
	if len(list) == 0 {
		return nil, invalidf("steps", "must not be empty")
	}
	if len(list) > MaxSteps {
		return nil, invalidf("steps", "at most %d steps, got %d", MaxSteps, len(list))
	}
	seen := map[string]bool{}
	steps := make([]Step, 0, len(list))
	for i, item := range list {
		step, err := parseStep(item, fmt.Sprintf("steps[%d]", i), on, seen)
		if err != nil {
			return nil, err
		}
		seen[step.ID] = true
		steps = append(steps, step)
	}
	return steps, nil
}

func parseStep(v any, field, on string, earlier map[string]bool) (Step, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return Step{}, invalidf(field, "must be a mapping")
	}
	var s Step
	var err error
	if s.ID, err = requiredString(m, "id", field+".id"); err != nil {
		return s, err
	}
	switch {
	case s.ID == "":
		return s, invalidf(field+".id", "must not be empty")
	case len(s.ID) > MaxStepIDLength:
		return s, invalidf(field+".id", "must be at most %d characters", MaxStepIDLength)
	case !stepIDPattern.MatchString(s.ID):
		return s, invalidf(field+".id", "may only contain A-Z, a-z, 0-9 and _")
	case earlier[s.ID]:
		return s, invalidf(field+".id", "duplicate step id %q", s.ID)
	}
	if s.Name, err = optionalString(m, "name", field+".name"); err != nil {
		return s, err
	}
	if s.If, err = optionalCondition(m, "if", field+".if"); err != nil {
		return s, err
	}
	if t, present := m["timeout_secs"]; present {
		n, ok := positiveInt(t)
		if !ok || n > MaxStepTimeoutSecs {
			return s, invalidf(field+".timeout_secs", "must be a whole number of seconds from 1 to %d", MaxStepTimeoutSecs)
		}
		s.TimeoutSecs = n
	}
	if d, present := m["depends_on"]; present {
		if s.DependsOn, err = parseDependsOn(d, field+".depends_on", earlier); err != nil {
			return s, err
		}
	}
	if s.Action, err = requiredString(m, "action", field+".action"); err != nil {
		return s, err
	}
	if err := parseAction(m, &s, field, on); err != nil {
		return s, err
	}
	return s, checkTemplates(&s, field)
}

func positiveInt(v any) (int, bool) {
	switch n := v.(type) {
	case uint64:
		if n > 0 && n <= math.MaxInt32 {
			return int(n), true
		}
	case int64:
		if n > 0 && n <= math.MaxInt32 {
			return int(n), true
		}
	}
	return 0, false
}

func parseDependsOn(v any, field string, earlier map[string]bool) ([]string, error) {
	list, ok := v.([]any)
	if !ok {
		return nil, invalidf(field, "must be a list of step ids")
	}
	seen := map[string]bool{}
	var out []string // nil when empty, as the canonical JSON omits it
	for _, item := range list {
		id, ok := item.(string)
		if !ok {
			return nil, invalidf(field, "must be a list of step ids")
		}
		if !earlier[id] {
			return nil, invalidf(field, "%q is not an earlier step", id)
		}
		if seen[id] {
			return nil, invalidf(field, "%q is listed twice", id)
		}
		seen[id] = true
		out = append(out, id)
	}
	return out, nil
}

var httpMethods = []string{"DELETE", "GET", "PATCH", "POST", "PUT"}

func parseAction(m map[string]any, s *Step, field, on string) error {
	var err error
	f := func(key string) string { return field + "." + key }
	switch s.Action {
	case ActionSendMessage:
		if s.Text, err = nonBlankString(m, "text", f("text")); err != nil {
			return err
		}
		if s.Channel, err = optionalString(m, "channel", f("channel")); err != nil {
			return err
		}
		if s.Channel != "" && !strings.Contains(s.Channel, "{{") {
			id, perr := uuid.Parse(s.Channel)
			if perr != nil {
				return invalidf(f("channel"), "must be a channel UUID or a template")
			}
			s.Channel = id.String()
		}
		if r, present := m["reply_in_thread"]; present {
			b, ok := r.(bool)
			if !ok {
				return invalidf(f("reply_in_thread"), "must be true or false")
			}
			if b && on != OnMessagePosted && on != OnReactionAdded && on != OnDiffPosted {
				return invalidf(f("reply_in_thread"), "needs a message_posted, reaction_added or diff_posted trigger")
			}
			s.ReplyInThread = b
		}
	case ActionAddReaction:
		s.Emoji, err = nonBlankString(m, "emoji", f("emoji"))
	case ActionCallWebhook:
		if s.URL, err = nonBlankString(m, "url", f("url")); err != nil {
			return err
		}
		if s.Method, err = optionalString(m, "method", f("method")); err != nil {
			return err
		}
		if s.Method == "" {
			s.Method = "POST"
		}
		s.Method = strings.ToUpper(s.Method)
		if i := sort.SearchStrings(httpMethods, s.Method); i == len(httpMethods) || httpMethods[i] != s.Method {
			return invalidf(f("method"), "must be one of %s", strings.Join(httpMethods, ", "))
		}
		if h, present := m["headers"]; present {
			hm, ok := h.(map[string]any)
			if !ok {
				return invalidf(f("headers"), "must be a mapping of strings")
			}
			for k, v := range hm {
				if s.Headers == nil {
					s.Headers = map[string]string{}
				}
				sv, ok := v.(string)
				if !ok {
					return invalidf(f("headers"), "value of %q must be a string", k)
				}
				s.Headers[k] = sv
			}
		}
		s.Body, err = optionalString(m, "body", f("body"))
	case ActionRequestApproval:
		if s.From, err = optionalString(m, "from", f("from")); err != nil {
			return err
		}
		if s.Message, err = nonBlankString(m, "message", f("message")); err != nil {
			return err
		}
		if s.Timeout, err = optionalString(m, "timeout", f("timeout")); err != nil {
			return err
		}
		if s.Timeout == "" {
			s.Timeout = DefaultApprovalLimit
		}
		if d, perr := time.ParseDuration(s.Timeout); perr != nil || d <= 0 {
			return invalidf(f("timeout"), "must be a positive duration like 30m or 24h")
		}
	case ActionDelay:
		if s.Duration, err = nonBlankString(m, "duration", f("duration")); err != nil {
			return err
		}
		d, perr := time.ParseDuration(s.Duration)
		switch {
		case perr != nil || d <= 0:
			return invalidf(f("duration"), "must be a positive duration like 30s or 5m")
		case d > MaxDelay:
			return invalidf(f("duration"), "must be at most %s", MaxDelay)
		}
	case ActionSendDM:
		if s.To, err = nonBlankString(m, "to", f("to")); err != nil {
			return err
		}
		s.Text, err = nonBlankString(m, "text", f("text"))
	case ActionSetChannelTopic:
		s.Topic, err = nonBlankString(m, "topic", f("topic"))
	default:
		return invalidf(f("action"), "unknown action %q", s.Action)
	}
	return err
}

// CanonicalJSON is the definition's stored JSON text.
func (d *Definition) CanonicalJSON() ([]byte, error) { return json.Marshal(d) }

// StepByID returns the step with id, if any.
func (d *Definition) StepByID(id string) (int, *Step) {
	for i := range d.Steps {
		if d.Steps[i].ID == id {
			return i, &d.Steps[i]
		}
	}
	return -1, nil
}

// ReachesOutside reports whether a step calls out of the relay
// (call_webhook): such a definition needs an owner or admin of the channel
// to save it and, at run time, to still be one.
func (d *Definition) ReachesOutside() bool {
	for _, s := range d.Steps {
		if s.Action == ActionCallWebhook {
			return true
		}
	}
	return false
}
