// Package template renders the placeholders of workflow step texts:
// {{ trigger.<field> }} and {{ steps.<id>.output.<field> }}, each optionally
// piped through filters ({{ trigger.author | npub }}).
//
// The renderer is deliberately small and predictable because its input is
// owner-authored text and its values come from strangers (message text,
// webhook bodies, HTTP responses):
//   - one pass, never recursive: a value that itself contains "{{ ... }}" is
//     copied verbatim, so a message cannot smuggle placeholders into a step;
//   - a placeholder naming a variable that does not exist stays as literal
//     text, so a typo is visible in the output instead of silently vanishing;
//   - an unclosed "{{" is plain text;
//   - an unknown filter or a malformed filter argument is an error, reported
//     at save time by Validate and again by Render.
package template

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// Context holds the values a template can reach.
type Context struct {
	// Trigger maps a trigger field (text, author, channel_id, ... or a
	// webhook key) to its value.
	Trigger map[string]string
	// Steps maps a finished step's id to its output object, whose values are
	// decoded JSON (string, bool, float64 or json.Number, nil, maps, slices).
	Steps map[string]map[string]any
}

// Error is a template that cannot be rendered: an unknown filter or a
// malformed filter argument. Its text names the filter, never a value.
type Error struct {
	Placeholder string // the placeholder as written, without the braces
	Reason      string
}

func (e *Error) Error() string {
	return fmt.Sprintf("template error in {{%s}}: %s", e.Placeholder, e.Reason)
}

const (
	openDelim  = "{{"
	closeDelim = "}}"
)

// Render replaces every placeholder in text with its value.
func Render(text string, ctx Context) (string, error) {
	return walk(text, func(p placeholder) (string, bool, error) {
		value, ok := lookup(p.path, ctx)
		if !ok {
			return "", false, nil
		}
		for _, f := range p.filters {
			value = f.apply(value)
		}
		return value, true, nil
	})
}

// Expand is Render with the caller choosing what replaces each
// placeholder: place receives the placeholder's path and, when the variable
// exists (found), its value after the filters, and returns the text to put
// in its stead. It lets a reader of a signed template see every placeholder
// it declares, and treat some values differently (fence untrusted ones,
// refuse unresolved ones), while parsing and filtering exactly as Render.
func Expand(text string, ctx Context, place func(path, value string, found bool) string) (string, error) {
	return walk(text, func(p placeholder) (string, bool, error) {
		value, found := lookup(p.path, ctx)
		if found {
			for _, f := range p.filters {
				value = f.apply(value)
			}
		}
		return place(p.path, value, found), true, nil
	})
}

// Validate reports the first placeholder whose filters are unknown or
// malformed. Variables are not checked: an unknown one renders literally.
func Validate(text string) error {
	_, err := walk(text, func(placeholder) (string, bool, error) { return "", false, nil })
	return err
}

// placeholder is one parsed "{{ path | filter ... }}".
type placeholder struct {
	path    string
	filters []filter
}

// walk scans text once, hands every well-formed placeholder to resolve and
// copies everything else. resolve returns ok=false to keep the placeholder
// as written.
func walk(text string, resolve func(placeholder) (string, bool, error)) (string, error) {
	if !strings.Contains(text, openDelim) {
		return text, nil
	}
	var out strings.Builder
	out.Grow(len(text))
	rest := text
	for {
		start := strings.Index(rest, openDelim)
		if start < 0 {
			out.WriteString(rest)
			return out.String(), nil
		}
		end := strings.Index(rest[start+len(openDelim):], closeDelim)
		if end < 0 {
			// Unclosed: the remainder is plain text.
			out.WriteString(rest)
			return out.String(), nil
		}
		inner := rest[start+len(openDelim) : start+len(openDelim)+end]
		// "{{ a {{ trigger.text }}": the first "{{" never closed, so it is
		// text, and the placeholder starts at the last "{{" before "}}".
		if last := strings.LastIndex(inner, openDelim); last >= 0 {
			out.WriteString(rest[:start+len(openDelim)+last])
			rest = rest[start+len(openDelim)+last:]
			continue
		}
		out.WriteString(rest[:start])
		whole := rest[start : start+len(openDelim)+end+len(closeDelim)]
		rest = rest[start+len(openDelim)+end+len(closeDelim):]

		p, err := parsePlaceholder(inner)
		if err != nil {
			return "", err
		}
		value, ok, err := resolve(p)
		if err != nil {
			return "", err
		}
		if ok {
			out.WriteString(value)
		} else {
			out.WriteString(whole)
		}
	}
}

func parsePlaceholder(inner string) (placeholder, error) {
	parts := strings.Split(inner, "|")
	p := placeholder{path: strings.TrimSpace(parts[0])}
	for _, raw := range parts[1:] {
		f, err := parseFilter(strings.TrimSpace(raw))
		if err != nil {
			return placeholder{}, &Error{Placeholder: inner, Reason: err.Error()}
		}
		p.filters = append(p.filters, f)
	}
	return p, nil
}

// filter transforms a rendered value.
type filter struct {
	name string
	n    int // truncate's length
}

func parseFilter(s string) (filter, error) {
	name, args, hasArgs := strings.Cut(s, "(")
	name = strings.TrimSpace(name)
	if hasArgs {
		if !strings.HasSuffix(args, ")") {
			return filter{}, fmt.Errorf("filter %q: missing closing parenthesis", name)
		}
		args = strings.TrimSpace(strings.TrimSuffix(args, ")"))
	}
	switch name {
	case "truncate":
		if !hasArgs {
			return filter{}, fmt.Errorf("filter truncate needs a length, as in truncate(80)")
		}
		n, err := strconv.Atoi(args)
		if err != nil || n < 0 {
			return filter{}, fmt.Errorf("filter truncate: length %q is not a non-negative integer", args)
		}
		return filter{name: name, n: n}, nil
	case "npub", "truncate_pubkey", "json":
		if hasArgs {
			return filter{}, fmt.Errorf("filter %s takes no arguments", name)
		}
		if name == "truncate_pubkey" {
			name = "npub"
		}
		return filter{name: name}, nil
	case "":
		return filter{}, fmt.Errorf("empty filter")
	default:
		return filter{}, fmt.Errorf("unknown filter %q", name)
	}
}

func (f filter) apply(value string) string {
	switch f.name {
	case "truncate":
		return truncateRunes(value, f.n)
	case "npub":
		return npubOrSame(value)
	case "json":
		return jsonString(value)
	}
	return value
}

// truncateRunes keeps the first n characters, never splitting one.
func truncateRunes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := 0
	for count := 0; i < len(s) && count < n; count++ {
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
	}
	return s[:i]
}

// npubOrSame encodes a 64-hex pubkey as npub; anything else passes through,
// so the filter never fails on a value that is not a key.
func npubOrSame(s string) string {
	if len(s) != 64 {
		return s
	}
	key, err := hex.DecodeString(s)
	if err != nil {
		return s
	}
	return nostr.EncodeNpub(key)
}

func jsonString(s string) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return strings.TrimSuffix(buf.String(), "\n")
}

// lookup resolves a path; ok=false means the variable does not exist.
func lookup(path string, ctx Context) (string, bool) {
	if field, ok := strings.CutPrefix(path, "trigger."); ok {
		v, found := ctx.Trigger[field]
		return v, found
	}
	if rest, ok := strings.CutPrefix(path, "steps."); ok {
		id, field, ok := strings.Cut(rest, ".output.")
		if !ok {
			return "", false
		}
		output, found := ctx.Steps[id]
		if !found {
			return "", false
		}
		v, found := output[field]
		if !found {
			return "", false
		}
		s, err := ValueString(v)
		if err != nil {
			return "", false
		}
		return s, true
	}
	return "", false
}

// ValueString turns a decoded JSON value into text: a string as-is, a bool
// or number as its text, null as empty, anything else as compact JSON.
func ValueString(v any) (string, error) {
	switch x := v.(type) {
	case nil:
		return "", nil
	case string:
		return x, nil
	case bool:
		return strconv.FormatBool(x), nil
	case json.Number:
		return x.String(), nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSuffix(buf.String(), "\n"), nil
}
