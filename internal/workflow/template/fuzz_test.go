package template

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzRender checks that no template text makes the renderer panic, that
// text without placeholders is returned unchanged, and that Validate and
// Render agree on which templates are bad.
func FuzzRender(f *testing.F) {
	for _, seed := range []string{
		"", "plain", "{{", "}}", "{{}}", "{{ trigger.text }}", "{{trigger.text|truncate(3)}}",
		"{{ trigger.author | npub }}", "{{ x | json }}", "{{ a {{ trigger.text }}", "{{|}}",
		"{{steps.s.output.f | truncate(2) | json}}", "{{trigger.text | truncate(99999999999999999999)}}",
		"{{trigger.text|truncate(}}", "é{{trigger.text}}é", "{{{{}}}}",
	} {
		f.Add(seed, "value {{trigger.text}}")
	}
	f.Fuzz(func(t *testing.T, text, value string) {
		ctx := Context{
			Trigger: map[string]string{"text": value, "author": value},
			Steps:   map[string]map[string]any{"s": {"f": value, "n": nil, "b": true}},
		}
		out, err := Render(text, ctx)
		if verr := Validate(text); (verr == nil) != (err == nil) {
			t.Fatalf("Validate=%v but Render=%v for %q", verr, err, text)
		}
		if !strings.Contains(text, "{{") {
			if err != nil || out != text {
				t.Fatalf("text without placeholders changed: %q -> %q, %v", text, out, err)
			}
		}
		if err == nil && utf8.ValidString(text) && utf8.ValidString(value) && !utf8.ValidString(out) {
			t.Fatalf("valid input rendered to invalid UTF-8: %q", out)
		}
	})
}
