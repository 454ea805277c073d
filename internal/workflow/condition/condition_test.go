package condition

import (
	"context"
	"fmt"
	"regexp/syntax"
	"strings"
	"testing"

	"github.com/expr-lang/expr"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/workflow/template"
)

func testVars() Vars {
	return Vars{
		"trigger_text":            "Deploy the Zoë build",
		"trigger_author":          "abc123",
		"trigger_emoji":           "🚀",
		"steps_fetch_output_code": "200",
	}
}

func TestEval(t *testing.T) {
	t.Parallel()
	cases := []struct {
		expression string
		want       bool
	}{
		{`trigger_text == "Deploy the Zoë build"`, true},
		{`trigger_text != "x"`, true},
		{`str_contains(trigger_text, "Zoë")`, true},
		{`str_contains(trigger_text, "zoë")`, false},
		{`str_starts_with(trigger_text, "Deploy")`, true},
		{`str_ends_with(trigger_text, "build")`, true},
		{`str_len(trigger_text) == 20`, true}, // characters, not bytes
		{`str_len(trigger_emoji) == 1`, true},
		{`str_len(trigger_text) > 100`, false},
		{`trigger_emoji == "🚀" && steps_fetch_output_code == "200"`, true},
		{`trigger_author == "nobody" || str_contains(trigger_text, "build")`, true},
		{`!(trigger_text == "")`, true},
		{`trigger_text == "a" ? false : true`, true},
		{`trigger_text in ["x", "Deploy the Zoë build"]`, true},
		{`trigger_text matches "^Deploy"`, true},
		{`let t = trigger_text; str_contains(t, "Deploy")`, true},
	}
	for _, tc := range cases {
		t.Run(tc.expression, func(t *testing.T) {
			t.Parallel()
			p, err := Compile(tc.expression)
			require.NoError(t, err)
			got, err := p.Eval(context.Background(), testVars())
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestCompileRejects(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, expression, reason string
	}{
		{"longer than 4096 bytes", `trigger_text == "` + strings.Repeat("a", 4096) + `"`, "the limit is 4096"},
		{"empty", "   ", "empty"},
		{"syntax error", `trigger_text ==`, "syntax error"},
		{"not a bool", `trigger_text`, "invalid expression"},
		{"number result", `str_len(trigger_text)`, "invalid expression"},
		{"variables are strings", `trigger_text + 1 == 2`, "invalid expression"},
		{"variable without a known prefix", `foo == "x"`, `unknown variable "foo"`},
		{"env access", `$env["trigger_text"] == "x"`, "unknown variable"},
		{"builtins are disabled", `len(trigger_text) > 0`, `builtin "len" is not available`},
		{"iteration builtins are rejected", `all(["a"], {# == "a"})`, `builtin "all" is not available`},
		{"nested iteration is rejected", `let a = [1, 2, 3]; any(a, {any(a, {# == 1})})`, "is not available"},
		{"reduce is rejected", `reduce([1], #acc) == 1`, "is not available"},
		{"repeat is rejected", `repeat(trigger_text, 1000000) == ""`, "is not available"},
		{"unknown function", `nope(trigger_text)`, "invalid expression"},
		{"helper with wrong arity", `str_contains(trigger_text)`, "invalid expression"},
		{"helper with wrong type", `str_len(1) == 1`, "invalid expression"},
		// The functions the operators compile to are the relay's own, not
		// the language's: called by name, their arguments escape the
		// checks the operators get (a comparison of operands of unknown
		// type, a lookup of an optional computed key).
		{"internal concat", `__buzz_concat(trigger_text, "x") == "x"`, `"__buzz_concat" is not available`},
		{"internal comparison", `__buzz_equal(trigger_text, "x")`, `"__buzz_equal" is not available`},
		{"internal fetch", `__buzz_fetch({"a": "b"}, trigger_text) == "b"`, `"__buzz_fetch" is not available`},
		{"internal name bound", `let __buzz_concat = 1; trigger_text + "x" == "x"`, `"__buzz_concat" is not available`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Compile(tc.expression)
			var cerr *Error
			require.ErrorAs(t, err, &cerr)
			require.Contains(t, cerr.Error(), tc.reason)
		})
	}
}

func TestCompileAcceptsExactly4096Bytes(t *testing.T) {
	t.Parallel()
	prefix, suffix := `trigger_text == "`, `"`
	expression := prefix + strings.Repeat("a", MaxExpressionBytes-len(prefix)-len(suffix)) + suffix
	require.Len(t, expression, MaxExpressionBytes)
	_, err := Compile(expression)
	require.NoError(t, err)
}

func TestEvalErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, expression, reason string
		vars                     Vars
	}{
		{"unknown variable at evaluation", `trigger_nope == "x"`, `unknown variable "trigger_nope"`, testVars()},
		{"unknown variable in a branch not taken", `trigger_text == "" && trigger_nope == "x"`, `unknown variable "trigger_nope"`, testVars()},
		{"range beyond the memory budget", `(1..100000)[0] == 1`, "evaluation failed", testVars()},
		{"bad regexp", `trigger_text matches trigger_author + "("`, "evaluation failed", testVars()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := Compile(tc.expression)
			require.NoError(t, err)
			_, err = p.Eval(context.Background(), tc.vars)
			var cerr *Error
			require.ErrorAs(t, err, &cerr)
			require.Contains(t, cerr.Error(), tc.reason)
		})
	}
}

func TestVarsFrom(t *testing.T) {
	t.Parallel()
	ctx := template.Context{
		Trigger: map[string]string{
			"text":           "real text",
			"author":         "abc",
			"order.id":       "42",
			"repo":           "buzz",
			"trigger_text":   "spoofed",
			"steps_x_output": "spoofed",
			"message.id":     "from webhook", // would become trigger_message_id
		},
		Steps: map[string]map[string]any{
			"fetch": {"status": float64(200), "ok": true, "none": nil, "body": map[string]any{"a": "b"}},
		},
	}
	require.Equal(t, Vars{
		"trigger_text":              "real text",
		"trigger_author":            "abc",
		"trigger_order_id":          "42",
		"trigger_repo":              "buzz",
		"trigger_message_id":        "from webhook",
		"steps_fetch_output_status": "200",
		"steps_fetch_output_ok":     "true",
		"steps_fetch_output_none":   "",
		"steps_fetch_output_body":   `{"a":"b"}`,
	}, VarsFrom(ctx))

	ctx.Trigger["message_id"] = "standard"
	require.Equal(t, "standard", VarsFrom(ctx)["trigger_message_id"], "a standard field overwrites a webhook field")
}

func FuzzCompile(f *testing.F) {
	for _, s := range []string{
		`trigger_text == "x"`, `str_len(trigger_text) > 3`, `1..1000000 == nil`, `let a = 1; a == 1`,
		`trigger_text matches "(a+)+$"`, `[trigger_text][0] == "x"`, `{"a": trigger_text}.a == ""`,
		`trigger_text | str_len() > 0`, `steps_a_output_b ?? "x" == "x"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, expression string) {
		p, err := Compile(expression)
		if err != nil {
			require.True(t, IsError(err))
			return
		}
		vars := Vars{}
		for _, name := range p.Variables() {
			vars[name] = expression
		}
		_, err = p.Eval(context.Background(), vars)
		if err != nil {
			require.True(t, IsError(err))
		}
	})
}

// doublingExpression binds a string and doubles it n times with let, each
// binding used twice: the text it builds grows as 2^n times the variable,
// from a few bytes of expression.
func doublingExpression(n int) string {
	var b strings.Builder
	b.WriteString("let s0 = trigger_text;")
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, " let s%d = s%d + s%d;", i, i-1, i-1)
	}
	fmt.Fprintf(&b, " str_len(s%d) > 0", n)
	return b.String()
}

func TestStringsBuiltByAnEvaluationAreBounded(t *testing.T) {
	t.Parallel()
	vars := Vars{"trigger_text": strings.Repeat("x", 1024)}

	// 1 KiB doubled 8 times is 256 KiB: within the budget.
	p, err := Compile(doublingExpression(8))
	require.NoError(t, err)
	ok, err := p.Eval(context.Background(), vars)
	require.NoError(t, err)
	require.True(t, ok)

	// Doubled 12 times it would be 4 MiB (and 30 times, a terabyte: the
	// process dies of it): the evaluation fails instead.
	p, err = Compile(doublingExpression(12))
	require.NoError(t, err)
	_, err = p.Eval(context.Background(), vars)
	var cerr *Error
	require.ErrorAs(t, err, &cerr)
	require.Contains(t, cerr.Error(), "builds more than")
}

func TestPlusNeedsOperandsOfKnownType(t *testing.T) {
	t.Parallel()
	// An element of a mixed list, or a branch of a mixed conditional, has
	// no static type, so its + could only be the library's own, unbounded
	// one: refused when saved.
	for _, expression := range []string{
		`let a = [trigger_text, 1][0]; let b = a + a; str_len(b) > 0`,
		`(trigger_text == "" ? trigger_text : 1) + trigger_text == ""`,
	} {
		_, err := Compile(expression)
		var cerr *Error
		require.ErrorAs(t, err, &cerr, expression)
		require.Contains(t, cerr.Reason, "join two strings or add two numbers", expression)
	}
	for _, expression := range []string{
		`trigger_text + "!" == "hello!"`, `1 + 2 == 3`, `1.5 + 1 > 2`, `let a = [trigger_text][0]; a + a == "hellohello"`,
	} {
		p, err := Compile(expression)
		require.NoError(t, err, expression)
		ok, err := p.Eval(context.Background(), Vars{"trigger_text": "hello"})
		require.NoError(t, err, expression)
		require.True(t, ok, expression)
	}
}

// costlyPattern compiles to a few thousand instructions, and Go's regexp
// steps through each of them for every byte of the text: on a 64 KiB
// message one match took half a second of CPU, which no deadline stops.
const costlyPattern = `(?:a?){500}a{500}b`

func TestRegexpWorkIsBounded(t *testing.T) {
	t.Parallel()
	long := Vars{"trigger_text": strings.Repeat("a", 64<<10)}
	for _, expression := range []string{
		`trigger_text matches "` + costlyPattern + `"`,
		`trigger_text matches trigger_text`, // a dynamic pattern pays too
	} {
		p, err := Compile(expression)
		require.NoError(t, err)
		_, err = p.Eval(context.Background(), long)
		var cerr *Error
		require.ErrorAs(t, err, &cerr, expression)
		require.Contains(t, cerr.Error(), "regular expression", expression)
	}

	// A repetitive pattern on a short text, or a simple one on the long
	// text, is fine.
	p, err := Compile(`trigger_text matches "(?:a?){50}a{50}b"`)
	require.NoError(t, err)
	ok, err := p.Eval(context.Background(), Vars{"trigger_text": strings.Repeat("a", 100) + "b"})
	require.NoError(t, err)
	require.True(t, ok)
	p, err = Compile(`trigger_text matches "^a+$"`)
	require.NoError(t, err)
	ok, err = p.Eval(context.Background(), long)
	require.NoError(t, err)
	require.True(t, ok)

	// A matches the overload cannot take (an operand of unknown type) would
	// run the library's own, unbounded one: refused when saved.
	_, err = Compile(`[trigger_text, 1][0] matches "a"`)
	var cerr *Error
	require.ErrorAs(t, err, &cerr)
	require.Contains(t, cerr.Reason, "matches needs two strings")
	// A constant pattern is still checked when saved.
	_, err = Compile(`trigger_text matches "("`)
	require.ErrorAs(t, err, &cerr)
	require.Contains(t, cerr.Reason, "missing closing )")
}

// hugeProgram is a 4,095-byte pattern that Go's regexp expands to 585,002
// instructions: compiling it took over a second of CPU (twice that per
// match, which compiled it twice), charged as 585,002 units against
// MaxMatchWork's 16.7 million when the text is short, so one evaluation
// could compile it 28 times after Eval had given up. The pattern's
// expanded size is charged before it is compiled.
var hugeProgram = strings.Repeat("a{1000}", 585)

// The charge is checked on the budget itself, not through Eval, which would
// compile the pattern for over a second with the mutation.
// Mutation killed: matches charging only the compiled program's size
// times the text (it compiles the pattern, over a second of CPU, and the
// charge after that fits the budget).
func TestRegexpCompileWorkIsBounded(t *testing.T) {
	t.Parallel()
	require.PanicsWithValue(t, errMatchesTooMuch, func() { newBudget().matches("", hugeProgram) },
		"compiling the pattern is charged, and refused, before it is done")

	// A written pattern that could never be compiled within the budget is
	// refused when saved, without compiling it: every evaluation compiles
	// the expression again, on the writer's path. It is refused before the
	// library compiles the expression, whose type checker compiled the
	// pattern in each pass (0.9 s, against 1.5 ms now).
	// Mutations killed: the save-time check compiling the constant pattern;
	// no check before the library's compile (the pattern is accepted).
	_, err := Compile(`trigger_text matches "` + hugeProgram[:4060] + `"`)
	var cerr *Error
	require.ErrorAs(t, err, &cerr)
	require.Contains(t, cerr.Reason, "regular expression")
}

// The bound charged for compiling is never below what the pattern
// compiles to.
func TestCompiledSizeBoundIsABound(t *testing.T) {
	t.Parallel()
	for _, pattern := range []string{
		"", "a", "^a+$", "(a|b|c)*", "(a*)*", "(?:)*", "(?i)hello world", `\bword\b|other`, "x{0}", "x{0,}", "x{2,5}",
		costlyPattern, "((a{10}){10}){10}", "[a-z]{3,999}", "(x{2,}){3,500}", `\pL{1000}`, "(?s).*foo.*",
	} {
		parsed, err := syntax.Parse(pattern, syntax.Perl)
		require.NoError(t, err, pattern)
		bound := compiledSizeBound(parsed)
		prog, err := syntax.Compile(parsed.Simplify())
		require.NoError(t, err, pattern)
		require.GreaterOrEqual(t, bound, len(prog.Inst), pattern)
	}
}

// Evaluations that share one evaluation's limits (an event's trigger
// filters) each get an equal part: text one evaluation may build alone is
// refused to each of two, and so are elements one may allocate and text
// one may read through. (Regular expression work is split the same way.)
// Mutation killed: Eval ignoring the share (of text built, of elements, or
// of text read).
func TestSharedEvaluationsSplitTheLimits(t *testing.T) {
	t.Parallel()
	p, err := Compile(`str_len(trigger_text + trigger_text) > 0`)
	require.NoError(t, err)
	vars := Vars{"trigger_text": strings.Repeat("a", 300_000)} // 600,000 bytes built, against 1 MiB
	ok, err := p.Eval(context.Background(), vars)
	require.NoError(t, err, "alone, the evaluation is within the limits")
	require.True(t, ok)
	_, err = p.Eval(WithShare(context.Background(), 2), vars)
	require.ErrorContains(t, err, "builds more than", "one of two evaluations gets half")

	p, err = Compile(`(1..6000)[0] == 1`) // 6,000 elements, against 10,000
	require.NoError(t, err)
	ok, err = p.Eval(context.Background(), vars)
	require.NoError(t, err, "alone, the evaluation is within the limits")
	require.True(t, ok)
	_, err = p.Eval(WithShare(context.Background(), 2), vars)
	require.ErrorContains(t, err, "memory budget exceeded", "one of two evaluations gets half")

	p, err = Compile("let t = trigger_text;" + strings.Repeat(" str_len(t) > 0 &&", 20) + " true")
	require.NoError(t, err)
	mib := Vars{"trigger_text": strings.Repeat("a", 1<<20)} // 20 MiB read, against 32 MiB
	ok, err = p.Eval(context.Background(), mib)
	require.NoError(t, err, "alone, the evaluation is within the limits")
	require.True(t, ok)
	_, err = p.Eval(WithShare(context.Background(), 2), mib)
	require.ErrorContains(t, err, "reads through more than", "one of two evaluations gets half")
}

// What str_contains, str_len, the text operators and "in" read through
// is bounded: each expression here, written to 4,096 bytes over a 256 KiB
// text, took up to a quarter of a second of CPU (the scanned range) and
// now stops at MaxScanWork, about 25 ms; a few reads of it are fine.
// Mutations killed: each of in, contains (str_contains and the contains
// operator), startsWith, endsWith and str_len not charging its read.
func TestScanWorkIsBounded(t *testing.T) {
	t.Parallel()
	fill := func(prefix, unit string) string {
		return prefix + strings.Repeat(unit, (MaxExpressionBytes-len(prefix)-len("true"))/len(unit)) + "true"
	}
	long := Vars{"trigger_text": strings.Repeat("a", 256<<10)}
	list := "[" + strings.Repeat("t,", 100) + "t]"
	for _, expression := range []string{
		fill("let r = 1..9998; ", "!(0 in r)&&"),
		fill("let t = trigger_text; let u = trigger_text[1:] + \"b\"; let a = "+list+"; ", "!(u in a)&&"),
		fill("let p = trigger_text[0:100] + \"b\"; ", "!str_contains(trigger_text,p)&&"),
		fill("let p = trigger_text[0:100] + \"b\"; let t = trigger_text; ", "!(t contains p)&&"),
		fill("let t = trigger_text; ", "str_len(t)>0&&"),
		fill("let t = trigger_text; ", "str_starts_with(t,t)&&"),
		fill("let t = trigger_text; ", "str_ends_with(t,t)&&"),
		fill("let t = trigger_text; ", "(t startsWith t)&&"),
		fill("let t = trigger_text; ", "(t endsWith t)&&"),
	} {
		p, err := Compile(expression)
		require.NoError(t, err, expression[:40])
		_, err = p.Eval(context.Background(), long)
		require.ErrorContains(t, err, "reads through more than", expression[:40])
	}
	for _, expression := range []string{
		`str_contains(trigger_text, "b") || str_len(trigger_text) > 0`,
		`trigger_text contains "b" || trigger_text startsWith "a"`,
		`str_len(trigger_text) in 1..9998 || 2 in [1, 2]`,
		`"b" in {"b": 1}`,
	} {
		p, err := Compile(expression)
		require.NoError(t, err, expression)
		ok, err := p.Eval(context.Background(), long)
		require.NoError(t, err, expression)
		require.True(t, ok, expression)
	}

	// A text operator the budgeted one cannot take (an operand of unknown
	// type) would be the library's own: refused when saved.
	_, err := Compile(`[trigger_text, 1][0] contains "a"`)
	var cerr *Error
	require.ErrorAs(t, err, &cerr)
	require.Contains(t, cerr.Reason, "contains needs two strings")
}

// Comparisons read too: "==" of two long equal texts compares every byte,
// and "==" of lists compares element by element, at every depth, so a
// list nesting the one before twice per let binding doubled the work per
// 40 bytes of expression. They are charged to the scan budget and split
// among an event's filters like the other reading.
// Mutations killed: compare charging nothing; compare charging only two
// texts (lists uncharged); "in" charging a list needle nothing.
func TestComparisonsAreCharged(t *testing.T) {
	t.Parallel()
	long := Vars{"trigger_text": strings.Repeat("a", 256<<10), "trigger_author": "abc"}
	repeat := func(prefix, unit string, n int) string { return prefix + strings.Repeat(unit, n) + "true" }
	equalCopy := `let t = trigger_text[1:]; let u = trigger_text[:262143]; ` // equal, not the same memory
	nested := func(depth int, last string) string {
		var b strings.Builder
		b.WriteString("let a0 = [trigger_author, trigger_author]; let b0 = [trigger_author, trigger_author]; ")
		for i := 1; i <= depth; i++ {
			fmt.Fprintf(&b, "let a%d = [a%d, a%d]; let b%d = [b%d, b%d]; ", i, i-1, i-1, i, i-1, i-1)
		}
		return b.String() + fmt.Sprintf(last, depth, depth)
	}
	for _, expression := range []string{
		repeat(equalCopy, "t==u&&", 200),
		repeat(equalCopy, "!(t!=u)&&", 200),
		repeat(equalCopy, "t<=u&&", 200),
		repeat(equalCopy, "!(t<u)&&", 200),
		repeat(equalCopy, "t>=u&&", 200),
		repeat(equalCopy, "!(t>u)&&", 200),
		repeat(equalCopy+"let l = [t, t]; let m = [u, u]; ", "l==m&&", 100),
		nested(40, "a%d == b%d"),
		nested(40, "a%d in [b%d]"),
	} {
		p, err := Compile(expression)
		require.NoError(t, err, expression[:60])
		_, err = p.Eval(context.Background(), long)
		require.ErrorContains(t, err, "reads through more than", expression[:60])
	}

	// Within one evaluation's budget, but not within a twentieth of it.
	fifty := repeat(equalCopy, "t==u&&", 50)
	p, err := Compile(fifty)
	require.NoError(t, err)
	ok, err := p.Eval(context.Background(), long)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = p.Eval(WithShare(context.Background(), 20), long)
	require.ErrorContains(t, err, "reads through more than")

	// Comparing what a filter compares costs little, and numbers and
	// booleans stay the library's own comparisons.
	for _, expression := range []string{
		`trigger_text != "b" && trigger_author == "abc" && trigger_author < "abd" && trigger_author >= "ab"`,
		`str_len(trigger_text) > 10 && 1 < 2.5 && true == !false && nil == nil && trigger_text != nil`,
		`[1, "a"] == [1, "a"] && {"a": [1]} == {"a": [1]} && [[1]] in [[[1]]]`,
		nested(3, "a%d == b%d"),
		`let l = [trigger_author, 1]; l[0] == "abc" && (l[1] == 1 ? "x" : 2) == "x" && ({"a": "d"}.b ?? "d") > "c" && {"a": "d"}?.a == "d"`,
	} {
		p, err := Compile(expression)
		require.NoError(t, err, expression)
		ok, err := p.Eval(WithShare(context.Background(), 20), long)
		require.NoError(t, err, expression)
		require.True(t, ok, expression)
	}

	// A comparison the budgeted one cannot take (an operand whose type the
	// checker left unknown) is refused when saved; one the checker refuses
	// keeps the checker's reason.
	_, err = Compile(`let l = [2, "a"]; l[0] - 1 == 1`)
	require.ErrorContains(t, err, "==: an operand's type is not known")
	_, err = Compile(`str_len(1) > 0`)
	require.ErrorContains(t, err, "cannot use int as argument")
}

// A map lookup of a computed key hashes the key, reading it through: 300
// lookups of a 256 KiB text took 7 ms, uncharged. It is charged like the
// other reading; a written key (m.a, m["a"]) and a list index are not.
// Mutations killed: the lookup charging nothing; computedMapKey answering
// false (the library's own lookup).
func TestMapLookupsOfComputedKeysAreCharged(t *testing.T) {
	t.Parallel()
	long := Vars{"trigger_text": strings.Repeat("a", 256<<10), "trigger_author": "a"}
	p, err := Compile(`let m = {"a": 1}; let t = trigger_text; ` + strings.Repeat(`m[t]==nil&&`, 300) + "true")
	require.NoError(t, err)
	_, err = p.Eval(context.Background(), long)
	require.ErrorContains(t, err, "reads through more than")

	for _, expression := range []string{
		`let m = {"a": 1}; m[trigger_author] == 1 && m.a == 1 && m["a"] == 1 && m?.a == 1`,
		`{"a": {"b": 2}}[trigger_author]["b"] == 2 && [{"a": 3}][0][trigger_author] == 3 && [1, 2][1] == 2`,
		`{"a": 1}[trigger_text] == nil`,
	} {
		p, err := Compile(expression)
		require.NoError(t, err, expression)
		ok, err := p.Eval(WithShare(context.Background(), 20), long)
		require.NoError(t, err, expression)
		require.True(t, ok, expression)
	}
	_, err = Compile(`{"a": 1}?.[trigger_author] == 1`)
	require.ErrorContains(t, err, "?.[key] of a computed key is not available")
}

// An "in" of a range with constant bounds stays the two comparisons the
// library's optimizer makes of it, allocating nothing, so even one of 20
// filters sharing an event's limits (500 elements each) may test a range
// of 1,000; a constant list (kept as one constant) costs the budgeted "in"
// little. Any other "in" is the budgeted one, whatever it tests.
// Mutation killed: optimizedAway answering false (the range is built, over
// the filter's 500 elements).
func TestInOverConstantsAllocatesNothing(t *testing.T) {
	t.Parallel()
	words := make([]string, 520)
	for i := range words {
		words[i] = fmt.Sprintf(`"%c%c"`, 'a'+i/26, 'a'+i%26)
	}
	vars := Vars{"trigger_text": "tz", "trigger_author": "abc"} // the last word
	for _, c := range []struct {
		expression string
		want       bool
	}{
		{`str_len(trigger_text) in 1..1000`, true},
		{`str_len(trigger_text) in 3..1000`, false},
		{`trigger_text in [` + strings.Join(words, ",") + `]`, true},
		{`str_len(trigger_text) in [1, 2, 3, 4]`, true},
		{`trigger_text not in ["a", "b"]`, true},
		{`trigger_text in [trigger_author, "tz"]`, true},
		{`4 in [1, "a", 4]`, true},
		{`trigger_author in {"abc": 1}`, true},
		{`let r = 1..5; 3 in r`, true},
		{`"a" in []`, false},
		{`trigger_author contains "b" && trigger_author startsWith "a" && trigger_author endsWith "c"`, true},
	} {
		name := c.expression[:min(len(c.expression), 40)]
		p, err := Compile(c.expression)
		require.NoError(t, err, name)
		got, err := p.Eval(WithShare(context.Background(), 20), vars)
		require.NoError(t, err, name)
		require.Equal(t, c.want, got, name)
	}
}

// A program that jumps backward (an iterating builtin, which Compile
// refuses by name before) is refused by its bytecode.
// Mutation killed: loops answering false.
func TestALoopingProgramIsFound(t *testing.T) {
	t.Parallel()
	looping, err := expr.Compile(`all([1, 2], {# > 0})`)
	require.NoError(t, err)
	require.True(t, loops(looping))
	straight, err := expr.Compile(`let a = [1, 2]; a[0] > 0 && 2 in a`)
	require.NoError(t, err)
	require.False(t, loops(straight))
}

// Every function Eval puts in the environment is a helper or carries the
// reserved prefix Compile refuses, so a function added for an operator
// later cannot be called by name. Mutation killed: an operator function
// named without the prefix.
func TestOperatorFunctionsAreReserved(t *testing.T) {
	t.Parallel()
	env := map[string]any{}
	newBudget().env(env)
	for name := range env {
		if !helpers[name] {
			require.True(t, strings.HasPrefix(name, internalPrefix), name)
		}
	}
}
