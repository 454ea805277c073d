package workflow_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/workflow"
)

const validYAML = `
name: Greeter
description: says hello
trigger:
  on: message_posted
  filter: 'str_contains(trigger_text, "hi")'
steps:
  - id: greet
    action: send_message
    text: "hello {{trigger.author}}"
    reply_in_thread: true
  - id: wait
    action: delay
    duration: 30s
    depends_on: [greet]
  - id: react
    action: add_reaction
    emoji: "+"
`

func TestParseValidDefinition(t *testing.T) {
	t.Parallel()
	def, err := workflow.Parse(validYAML)
	require.NoError(t, err)
	require.Equal(t, "Greeter", def.Name)
	require.True(t, def.Enabled, "enabled defaults to true")
	require.Equal(t, workflow.OnMessagePosted, def.Trigger.On)
	require.Len(t, def.Steps, 3)
	require.Equal(t, []string{"greet"}, def.Steps[1].DependsOn)
	require.Equal(t, 30e9, float64(def.Steps[1].DelayDuration()))

	// The canonical JSON parses back to the same definition.
	js, err := def.CanonicalJSON()
	require.NoError(t, err)
	again, err := workflow.Parse(string(js))
	require.NoError(t, err)
	require.Equal(t, def, again)
}

func TestParseNormalizesCron(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"*/5 * * * *":        "0 */5 * * * * *",
		"30 0 9 * * MON":     "30 0 9 * * MON *",
		"0 0 12 1 * ? *":     "0 0 12 1 * ? *",
		"  15  3 * * *   ":   "0 15 3 * * * *",
		"0 0 0 1 1 * *":      "0 0 0 1 1 * *",
		"0 30 8 * * 1-5 *":   "0 30 8 * * 1-5 *",
		"0 0 */2 * * * *":    "0 0 */2 * * * *",
		"0 0 0 29 2 * *":     "0 0 0 29 2 * *",
		"59 59 23 31 12 * *": "59 59 23 31 12 * *",
	} {
		got, err := workflow.NormalizeCron(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
		_, err = workflow.CronSchedule(got)
		require.NoError(t, err, in)
	}
}

func TestParseEnabledFalse(t *testing.T) {
	t.Parallel()
	def, err := workflow.Parse("name: x\nenabled: false\ntrigger: {on: webhook}\nsteps: [{id: a, action: add_reaction, emoji: x}]")
	require.NoError(t, err)
	require.False(t, def.Enabled)
}

// Every validation rule, one row each: the definition is refused with a
// text that names the field.
func TestParseBadInputCatalogue(t *testing.T) {
	t.Parallel()
	const trig = "trigger: {on: message_posted}\n"
	const step = "steps: [{id: a, action: add_reaction, emoji: x}]\n"
	long := strings.Repeat("a", 65)
	for _, c := range []struct{ name, yaml, want string }{
		{"yaml syntax", "name: [unclosed", "invalid YAML: "},
		{"top level not a mapping", "- a\n- b", "invalid definition: (top level): must be a mapping"},
		{"name missing", trig + step, "invalid definition: name: is required"},
		{"name not a string", "name: [1]\n" + trig + step, "invalid definition: name: must be a string"},
		{"name blank", "name: '  '\n" + trig + step, "invalid definition: name: must not be blank"},
		{"name too long", "name: " + strings.Repeat("n", 256) + "\n" + trig + step, "invalid definition: name: must be at most 255 bytes"},
		{"description not a string", "name: x\ndescription: [1]\n" + trig + step, "invalid definition: description: must be a string"},
		{"enabled not a bool", "name: x\nenabled: maybe\n" + trig + step, "invalid definition: enabled: must be true or false"},
		{"trigger missing", "name: x\n" + step, "invalid definition: trigger: is required"},
		{"trigger not a mapping", "name: x\ntrigger: 3\n" + step, "invalid definition: trigger: must be a mapping"},
		{"trigger.on missing", "name: x\ntrigger: {filter: x}\n" + step, "invalid definition: trigger.on: is required"},
		{"trigger.on unknown", "name: x\ntrigger: {on: sunrise}\n" + step, "invalid definition: trigger.on: unknown trigger"},
		{"filter too long", "name: x\ntrigger: {on: message_posted, filter: '" + strings.Repeat("1", 4097) + "'}\n" + step, "invalid definition: trigger.filter: expression longer than 4096 bytes"},
		{"filter not a string", "name: x\ntrigger: {on: diff_posted, filter: [1]}\n" + step, "invalid definition: trigger.filter: must be a string"},
		{"emoji not a string", "name: x\ntrigger: {on: reaction_added, emoji: [1]}\n" + step, "invalid definition: trigger.emoji: must be a string"},
		{"schedule without cron or interval", "name: x\ntrigger: {on: schedule}\n" + step, "invalid definition: trigger: a schedule needs exactly one of cron or interval, got neither"},
		{"schedule with both", "name: x\ntrigger: {on: schedule, cron: '* * * * *', interval: 1h}\n" + step, "got both"},
		{"cron field count", "name: x\ntrigger: {on: schedule, cron: '* * *'}\n" + step, "invalid definition: trigger.cron: want 5, 6 or 7 fields, got 3"},
		{"cron bad field", "name: x\ntrigger: {on: schedule, cron: '61 * * * *'}\n" + step, "invalid definition: trigger.cron: "},
		{"cron year", "name: x\ntrigger: {on: schedule, cron: '0 0 0 1 1 * 2030'}\n" + step, "invalid definition: trigger.cron: the year field must be *"},
		{"cron on 30 February", "name: x\ntrigger: {on: schedule, cron: '0 0 0 30 2 *'}\n" + step, "invalid definition: trigger.cron: names no date that occurs"},
		{"cron on 31 April", "name: x\ntrigger: {on: schedule, cron: '0 0 31 4 *'}\n" + step, "invalid definition: trigger.cron: names no date that occurs"},
		{"interval not a duration", "name: x\ntrigger: {on: schedule, interval: often}\n" + step, "invalid definition: trigger.interval: not a duration"},
		{"interval below 1 s", "name: x\ntrigger: {on: schedule, interval: 500ms}\n" + step, "invalid definition: trigger.interval: must be at least 1s"},
		{"interval fractional seconds", "name: x\ntrigger: {on: schedule, interval: 60500ms}\n" + step, "invalid definition: trigger.interval: must be a whole number of seconds"},
		{"steps missing", "name: x\n" + trig, "invalid definition: steps: is required"},
		{"steps not a list", "name: x\n" + trig + "steps: {a: 1}", "invalid definition: steps: must be a list"},
		{"steps empty", "name: x\n" + trig + "steps: []", "invalid definition: steps: must not be empty"},
		{"more than 50 steps", "name: x\n" + trig + "steps:\n" + strings.Repeat("  - {id: a, action: delay, duration: 1s}\n", 51), "invalid definition: steps: at most 50 steps, got 51"},
		{"step not a mapping", "name: x\n" + trig + "steps: [3]", "invalid definition: steps[0]: must be a mapping"},
		{"step id missing", "name: x\n" + trig + "steps: [{action: delay, duration: 1s}]", "invalid definition: steps[0].id: is required"},
		{"step id empty", "name: x\n" + trig + "steps: [{id: '', action: delay, duration: 1s}]", "invalid definition: steps[0].id: must not be empty"},
		{"step id too long", "name: x\n" + trig + "steps: [{id: " + long + ", action: delay, duration: 1s}]", "invalid definition: steps[0].id: must be at most 64 characters"},
		{"step id characters", "name: x\n" + trig + "steps: [{id: a-b, action: delay, duration: 1s}]", "invalid definition: steps[0].id: may only contain"},
		{"step id duplicate", "name: x\n" + trig + "steps: [{id: a, action: delay, duration: 1s}, {id: a, action: delay, duration: 1s}]", "invalid definition: steps[1].id: duplicate step id"},
		{"step name not a string", "name: x\n" + trig + "steps: [{id: a, name: [1], action: delay, duration: 1s}]", "invalid definition: steps[0].name: must be a string"},
		{"step if too long", "name: x\n" + trig + "steps: [{id: a, if: '" + strings.Repeat("1", 4097) + "', action: delay, duration: 1s}]", "invalid definition: steps[0].if: expression longer"},
		{"timeout_secs not positive", "name: x\n" + trig + "steps: [{id: a, timeout_secs: 0, action: delay, duration: 1s}]", "invalid definition: steps[0].timeout_secs: must be a whole number of seconds from 1 to 600"},
		{"timeout_secs negative", "name: x\n" + trig + "steps: [{id: a, timeout_secs: -5, action: delay, duration: 1s}]", "invalid definition: steps[0].timeout_secs: must be a whole number of seconds from 1 to 600"},
		{"timeout_secs too large", "name: x\n" + trig + "steps: [{id: b, action: delay, duration: 1s}, {id: a, timeout_secs: 601, action: delay, duration: 1s}]", "invalid definition: steps[1].timeout_secs: must be a whole number of seconds from 1 to 600"},
		{"timeout_secs not a number", "name: x\n" + trig + "steps: [{id: a, timeout_secs: soon, action: delay, duration: 1s}]", "invalid definition: steps[0].timeout_secs: must be a whole number of seconds from 1 to 600"},
		{"timeout_secs fractional", "name: x\n" + trig + "steps: [{id: a, timeout_secs: 1.5, action: delay, duration: 1s}]", "invalid definition: steps[0].timeout_secs: must be a whole number of seconds from 1 to 600"},
		{"depends_on not a list", "name: x\n" + trig + "steps: [{id: a, depends_on: b, action: delay, duration: 1s}]", "invalid definition: steps[0].depends_on: must be a list of step ids"},
		{"depends_on later step", "name: x\n" + trig + "steps: [{id: a, depends_on: [b], action: delay, duration: 1s}, {id: b, action: delay, duration: 1s}]", `invalid definition: steps[0].depends_on: "b" is not an earlier step`},
		{"depends_on itself", "name: x\n" + trig + "steps: [{id: a, depends_on: [a], action: delay, duration: 1s}]", `invalid definition: steps[0].depends_on: "a" is not an earlier step`},
		{"depends_on duplicate", "name: x\n" + trig + "steps: [{id: a, action: delay, duration: 1s}, {id: b, depends_on: [a, a], action: delay, duration: 1s}]", `invalid definition: steps[1].depends_on: "a" is listed twice`},
		{"action missing", "name: x\n" + trig + "steps: [{id: a}]", "invalid definition: steps[0].action: is required"},
		{"action unknown", "name: x\n" + trig + "steps: [{id: a, action: launch}]", `invalid definition: steps[0].action: unknown action "launch"`},
		{"send_message text missing", "name: x\n" + trig + "steps: [{id: a, action: send_message}]", "invalid definition: steps[0].text: is required"},
		{"send_message text blank", "name: x\n" + trig + "steps: [{id: a, action: send_message, text: ' '}]", "invalid definition: steps[0].text: must not be blank"},
		{"send_message channel not a UUID", "name: x\n" + trig + "steps: [{id: a, action: send_message, text: hi, channel: general}]", "invalid definition: steps[0].channel: must be a channel UUID or a template"},
		{"reply_in_thread not a bool", "name: x\n" + trig + "steps: [{id: a, action: send_message, text: hi, reply_in_thread: 1}]", "invalid definition: steps[0].reply_in_thread: must be true or false"},
		{"reply_in_thread on schedule", "name: x\ntrigger: {on: schedule, interval: 1h}\nsteps: [{id: a, action: send_message, text: hi, reply_in_thread: true}]", "invalid definition: steps[0].reply_in_thread: needs a message_posted"},
		{"reply_in_thread on webhook", "name: x\ntrigger: {on: webhook}\nsteps: [{id: a, action: send_message, text: hi, reply_in_thread: true}]", "invalid definition: steps[0].reply_in_thread: needs a message_posted"},
		{"add_reaction emoji missing", "name: x\n" + trig + "steps: [{id: a, action: add_reaction}]", "invalid definition: steps[0].emoji: is required"},
		{"call_webhook url missing", "name: x\n" + trig + "steps: [{id: a, action: call_webhook}]", "invalid definition: steps[0].url: is required"},
		{"call_webhook method unknown", "name: x\n" + trig + "steps: [{id: a, action: call_webhook, url: 'https://x.example', method: TRACE}]", "invalid definition: steps[0].method: must be one of"},
		{"call_webhook headers not a mapping", "name: x\n" + trig + "steps: [{id: a, action: call_webhook, url: 'https://x.example', headers: [1]}]", "invalid definition: steps[0].headers: must be a mapping of strings"},
		{"call_webhook header value", "name: x\n" + trig + "steps: [{id: a, action: call_webhook, url: 'https://x.example', headers: {X: 1}}]", `invalid definition: steps[0].headers: value of "X" must be a string`},
		{"call_webhook body not a string", "name: x\n" + trig + "steps: [{id: a, action: call_webhook, url: 'https://x.example', body: [1]}]", "invalid definition: steps[0].body: must be a string"},
		{"request_approval message missing", "name: x\n" + trig + "steps: [{id: a, action: request_approval, from: any}]", "invalid definition: steps[0].message: is required"},
		{"request_approval timeout", "name: x\n" + trig + "steps: [{id: a, action: request_approval, message: ok?, timeout: soon}]", "invalid definition: steps[0].timeout: must be a positive duration"},
		{"delay duration missing", "name: x\n" + trig + "steps: [{id: a, action: delay}]", "invalid definition: steps[0].duration: is required"},
		{"delay duration not a duration", "name: x\n" + trig + "steps: [{id: a, action: delay, duration: later}]", "invalid definition: steps[0].duration: must be a positive duration"},
		{"delay over 300 s", "name: x\n" + trig + "steps: [{id: a, action: delay, duration: 301s}]", "invalid definition: steps[0].duration: must be at most 5m0s"},
		{"send_dm to missing", "name: x\n" + trig + "steps: [{id: a, action: send_dm, text: hi}]", "invalid definition: steps[0].to: is required"},
		{"filter does not compile", "name: x\ntrigger: {on: message_posted, filter: 'trigger_text =='}\n" + step, "invalid definition: trigger.filter: "},
		{"if does not compile", "name: x\n" + trig + "steps: [{id: a, if: '((', action: delay, duration: 1s}]", "invalid definition: steps[0].if: "},
		{"filter calls an internal function", "name: x\ntrigger: {on: message_posted, filter: '__buzz_in(trigger_text, [\"a\"])'}\n" + step, `invalid definition: trigger.filter: condition: "__buzz_in" is not available; the helpers are str_contains, str_starts_with, str_ends_with and str_len`},
		{"text with an unknown filter", "name: x\n" + trig + "steps: [{id: a, action: send_message, text: '{{trigger.text | shout}}'}]", "invalid definition: steps[0].text: "},
		{"set_channel_topic topic missing", "name: x\n" + trig + "steps: [{id: a, action: set_channel_topic}]", "invalid definition: steps[0].topic: is required"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := workflow.Parse(c.yaml)
			require.Error(t, err)
			require.ErrorIs(t, err, workflow.ErrInvalid)
			require.Contains(t, err.Error(), c.want)
			require.True(t, strings.HasPrefix(err.Error(), "invalid definition: ") || strings.HasPrefix(err.Error(), "invalid YAML: "), err.Error())
		})
	}
}

// Collections nested deeper than MaxNesting are refused before the YAML
// parser sees them: its time grows faster than linearly with nesting, and
// 64 KiB of "[" held it for 26 s inside the shared write transaction. The
// depth is counted on the parser's own tokens, so brackets inside quoted
// strings do not count, and block levels ("- - - x", indentation) do.
//
// Mutation killed: without the pre-scan in Parse, every deep case gets
// the parser's own verdict (a YAML error or "must be a string") instead
// of the nesting refusal; the 64 KiB case takes the parser 26 s and 8 GB.
func TestParseRefusesDeepNesting(t *testing.T) {
	t.Parallel()
	const step = "\ntrigger: {on: webhook}\nsteps: [{id: a, action: delay, duration: 1s}]"
	nest := func(open, close string, n int) string {
		return strings.Repeat(open, n) + "x" + strings.Repeat(close, n)
	}
	for name, text := range map[string]string{
		"64 KiB of [":               "name: " + strings.Repeat("[", 65000),
		"32k [ then 32k ]":          "name: " + strings.Repeat("[", 32000) + strings.Repeat("]", 32000),
		"33 balanced [":             "name: x\ndescription: " + nest("[", "]", 33) + step,
		"33 balanced {":             "name: x\ndescription: " + nest("{a: ", "}", 33) + step,
		"block entries on one line": "name: x\ndescription:\n" + strings.Repeat("- ", 40) + "x" + step,
		"indentation":               "name: x\ndescription:\n" + indented(40) + step,
		"fake closers in strings":   "name: x\ndescription: " + strings.Repeat(`['] ',`, 40) + step,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := workflow.Parse(text)
			require.ErrorIs(t, err, workflow.ErrInvalid)
			require.Contains(t, err.Error(), "invalid YAML: nested deeper than 32 levels")
		})
	}
	// Brackets in quoted and block scalars are text, however many; and
	// nesting just under the bound parses (an unknown key is ignored).
	for _, text := range []string{
		"name: x\ndescription: '" + strings.Repeat("[", 1000) + "'" + step,
		"name: x\ndescription: \"" + strings.Repeat("{[", 1000) + "\"" + step,
		"name: x\ndescription: |\n  " + strings.Repeat("[", 1000) + step,
		"name: x\nnotes: " + nest("[", "]", 30) + step,
	} {
		_, err := workflow.Parse(text)
		require.NoError(t, err, text[:60])
	}
}

// indented is n block mappings, each nested under the one before.
func indented(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(strings.Repeat(" ", i) + "k:\n")
	}
	return b.String() + strings.Repeat(" ", n) + "v"
}
