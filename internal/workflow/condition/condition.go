// Package condition compiles and evaluates the boolean expressions of
// workflow trigger filters and step "if" conditions.
//
// Expressions are owner-authored and may be evaluated for every message in
// a channel, so the language is kept small and every evaluation is bounded:
//   - variables are strings only: trigger_<field> and
//     steps_<id>_output_<field> (the template paths with dots turned into
//     underscores), plus four helpers str_contains, str_starts_with,
//     str_ends_with and str_len;
//   - all of expr's builtins are disabled, and the iterating ones (all, any,
//     filter, map, reduce, ...), which expr keeps even then, are rejected at
//     compile time; without them the bytecode has no backward jump, so every
//     instruction runs at most once;
//   - an expression is at most 4096 bytes and its syntax tree is capped, and
//     the range operator ("1..n") is bounded by the VM's memory budget;
//   - "+" between two strings builds at most MaxBuiltBytes per evaluation:
//     a let binding used twice doubles a string, so 30 bindings of a short
//     message ask for a terabyte, which the VM's budget does not count and
//     the process dies of. A "+" whose operands' types are not known when
//     it is compiled (a list element) would be the library's unbounded one
//     and is refused; "matches" likewise does at most MaxMatchWork of
//     regular expression work, which no deadline could stop;
//   - str_contains, str_starts_with, str_ends_with, str_len, the contains,
//     startsWith and endsWith operators, "in", the comparisons (==, !=,
//     <, <=, >, >= of anything but two numbers or two booleans) and map
//     lookups of a computed key (m[key], which hashes the key) read
//     through at most MaxScanWork per evaluation (text bytes, and list
//     elements weighted as elementWork bytes each);
//   - the compiled bytecode is checked for a backward jump and refused with
//     one, so an evaluation runs at most as many instructions as the
//     expression compiled to;
//   - no wall-clock deadline fails an evaluation: its work is bounded by the
//     limits above, not by time, and on a busy machine a trivial condition
//     could miss any deadline short enough to matter (it did miss a 100 ms
//     one). What the limits do not count is the instructions themselves,
//     bounded by the expression's length. Only EvalBackstop, far beyond that, ends the
//     wait for an evaluation as a last resort, should something unforeseen
//     run long; Eval then returns while the work, which cannot be stopped,
//     finishes on its own;
//   - a variable that does not exist at evaluation time is an error, not a
//     silent false, so a typo in a filter is reported rather than ignored.
package condition

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"regexp/syntax"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/parser"
	"github.com/expr-lang/expr/vm"
	"github.com/expr-lang/expr/vm/runtime"

	"github.com/buzzrelay/buzz/internal/workflow/template"
)

const (
	// MaxExpressionBytes bounds what an owner can store and what the
	// compiler has to chew on.
	MaxExpressionBytes = 4096
	// EvalBackstop is the longest Eval waits for an evaluation. The work
	// limits bound an evaluation to about a tenth of a second of CPU; this
	// only catches what they might miss, so it is long enough that no
	// machine busy enough to reach it with a bounded evaluation is still
	// serving.
	EvalBackstop = 10 * time.Second
	// maxNodes caps the syntax tree; 4096 bytes cannot need more.
	maxNodes = 2048
	// memoryBudget caps the elements that ranges, lists and maps may
	// allocate in one evaluation.
	memoryBudget = 10000
	// MaxBuiltBytes bounds the text one evaluation may build with "+". A
	// filter compares text; it never needs more than a few copies of the
	// largest value (a message, a webhook field, a response body).
	MaxBuiltBytes = 1 << 20
)

// MaxMatchWork bounds the regular expression work of one evaluation, counted
// as text bytes times compiled instructions per match, plus compileWork per
// instruction a pattern may compile to: Go's regexp steps
// through every instruction for every byte, and a match cannot be stopped,
// so a pattern like (?:a?){500}a{500} on a 64 KiB message took half a second
// of CPU after Eval had given up on it. This allows a 250-instruction
// pattern over the largest message.
const MaxMatchWork = 1 << 24

// MaxScanWork bounds what one evaluation may read through: the bytes of
// the texts str_contains, str_starts_with, str_ends_with, str_len and the
// contains, startsWith and endsWith operators look at, plus, for each
// "in" over a list, elementWork per element and the needle's reading
// (readWork) per element, and for each comparison the reading of its
// smaller operand. Without it these were bounded only by the expression's length:
// `let r = 1..9998; !(0 in r) && !(0 in r) && ...` to 4,096 bytes took a
// quarter of a second of CPU, 290 str_contains over a 512 KiB text 170 ms,
// and no budget split them among an event's filters. The budget is about
// 20 to 30 ms of CPU.
const MaxScanWork = 1 << 25

// elementWork is the work charged per element an "in" compares: comparing
// one through reflection costs about what reading 128 bytes of text does
// (measured: about 70 ns against about 0.7 ns a byte).
const elementWork = 128

// The environment functions "+" between two strings, "matches", "in" over
// a list and the text operators compile to. Eval puts in fresh ones per
// evaluation, which count their work.
const (
	concatFunc     = "__buzz_concat"
	matchesFunc    = "__buzz_matches"
	inFunc         = "__buzz_in"
	containsFunc   = "__buzz_contains"
	startsWithFunc = "__buzz_starts_with"
	endsWithFunc   = "__buzz_ends_with"
)

// fetchFunc is what a lookup of a computed key in a map (m[key]) compiles
// to.
const fetchFunc = "__buzz_fetch"

// The budgeted comparisons, one per operator; a comparison of two numbers
// or two booleans stays the library's own, which reads nothing.
var compareFuncs = map[string]string{
	"==": "__buzz_equal", "!=": "__buzz_not_equal",
	"<": "__buzz_less", "<=": "__buzz_less_or_equal", ">": "__buzz_more", ">=": "__buzz_more_or_equal",
}

var (
	errBuiltTooMuch   = fmt.Errorf("the expression builds more than %d bytes of text", MaxBuiltBytes)
	errPatternTooLong = fmt.Errorf("a regular expression is longer than %d bytes", MaxExpressionBytes)
	errMatchesTooMuch = fmt.Errorf("the expression needs more than %d units of regular expression work (text bytes times pattern instructions)", MaxMatchWork)
	errScansTooMuch   = fmt.Errorf("the expression reads through more than %d units of text and list elements", MaxScanWork)
)

// evalBudget is one evaluation's allowance; its methods panic when it runs
// out, which the VM turns into the evaluation's error.
type evalBudget struct{ text, match, scan int }

func newBudget() *evalBudget {
	return &evalBudget{text: MaxBuiltBytes, match: MaxMatchWork, scan: MaxScanWork}
}

// env puts the budgeted functions in env.
func (b *evalBudget) env(env map[string]any) {
	env[concatFunc], env[matchesFunc] = b.concat, b.matches
	env[inFunc] = b.in
	env[containsFunc], env[startsWithFunc], env[endsWithFunc] = b.contains, b.startsWith, b.endsWith
	env["str_contains"], env["str_starts_with"], env["str_ends_with"] = b.contains, b.startsWith, b.endsWith
	env["str_len"] = b.strLen
	env[fetchFunc] = func(from, key any) any {
		// A map lookup hashes its key: a long text key is read through.
		if k, ok := key.(string); ok {
			b.read(len(k)+1, 1)
		}
		return runtime.Fetch(from, key)
	}
	env[compareFuncs["=="]] = func(x, y any) bool { b.compare(x, y); return runtime.Equal(x, y) }
	env[compareFuncs["!="]] = func(x, y any) bool { b.compare(x, y); return !runtime.Equal(x, y) }
	env[compareFuncs["<"]] = func(x, y any) bool { b.compare(x, y); return runtime.Less(x, y) }
	env[compareFuncs["<="]] = func(x, y any) bool { b.compare(x, y); return runtime.LessOrEqual(x, y) }
	env[compareFuncs[">"]] = func(x, y any) bool { b.compare(x, y); return runtime.More(x, y) }
	env[compareFuncs[">="]] = func(x, y any) bool { b.compare(x, y); return runtime.MoreOrEqual(x, y) }
}

// compare charges what comparing x with y may read: the bytes of the
// shorter text, or, for lists and maps, whose comparison goes through
// them element by element, the smaller one's reading (readWork). Without
// it, 450 "==" of two equal 256 KiB texts took 5 ms, and "==" of two
// lists each nesting the one before twice (`let a1 = [a0, a0]; ...`)
// compared 2^depth elements: 130 ms at depth 22, doubling per level of a
// 4 KiB expression.
func (b *evalBudget) compare(x, y any) {
	if s, ok := x.(string); ok {
		if t, ok := y.(string); ok {
			b.read(min(len(s), len(t))+1, 1)
			return
		}
	}
	b.read(min(readWork(x, b.scan+1), readWork(y, b.scan+1))+1, 1)
}

// readWork is the scan work of reading v through: its text bytes, and
// elementWork per list element or map entry, at every depth. It stops
// counting past limit, so a list nesting itself 2^n times is not walked to
// its end to learn that it is over the budget.
func readWork(v any, limit int) int {
	switch v := v.(type) {
	case string:
		return len(v)
	case nil, bool, int, float64:
		return 1
	}
	rv := reflect.ValueOf(v)
	work := 1
	switch rv.Kind() {
	case reflect.Slice, reflect.Array:
		for i := 0; i < rv.Len() && work <= limit; i++ {
			work += elementWork + readWork(rv.Index(i).Interface(), limit-work)
		}
	case reflect.Map:
		for it := rv.MapRange(); it.Next() && work <= limit; {
			work += elementWork + readWork(it.Key().Interface(), limit-work) + readWork(it.Value().Interface(), limit-work)
		}
	}
	return work
}

// read takes n times m units of scan work.
func (b *evalBudget) read(n, m int) {
	if m > 0 && n > b.scan/m { // divided, so huge operands cannot overflow
		panic(errScansTooMuch)
	}
	b.scan -= n * m
}

func (b *evalBudget) contains(s, sub string) bool {
	b.read(len(s)+len(sub), 1)
	return strings.Contains(s, sub)
}

func (b *evalBudget) startsWith(s, prefix string) bool {
	b.read(len(prefix)+1, 1)
	return strings.HasPrefix(s, prefix)
}

func (b *evalBudget) endsWith(s, suffix string) bool {
	b.read(len(suffix)+1, 1)
	return strings.HasSuffix(s, suffix)
}

// strLen counts characters, not bytes, like the truncate filter.
func (b *evalBudget) strLen(s string) int {
	b.read(len(s)+1, 1)
	return utf8.RuneCountInString(s)
}

// in is the library's "in", charged per element of a list it compares (a
// map's lookup, as one). The checker types a range as a list of any, so
// the list is taken as any too.
func (b *evalBudget) in(needle any, list any) bool {
	// Comparing the needle with an element reads at most the needle
	// through (a list needle element by element).
	per := elementWork
	if s, ok := needle.(string); ok {
		per += len(s)
	} else if needle != nil {
		per += readWork(needle, b.scan+1)
	}
	n := 1
	if v := reflect.ValueOf(list); v.Kind() == reflect.Slice || v.Kind() == reflect.Array {
		n = v.Len()
	}
	b.read(n, per)
	return runtime.In(needle, list)
}

type shareKey struct{}

// share is what WithShare puts in a context.
type share struct {
	n     int
	until time.Time // the backstop of the n evaluations together
}

// WithShare makes every evaluation under ctx one of n evaluations that
// share one evaluation's limits: each may build MaxBuiltBytes/n of text, do
// MaxMatchWork/n of regular expression work and MaxScanWork/n of reading,
// and allocate 1/n of the elements; all of them together are waited for at
// most one EvalBackstop. An event's trigger filters, all evaluated inside
// its write transaction, then cost together at most what one evaluation
// may, however many workflows its channel has, and no filter can spend its
// neighbours' part.
func WithShare(ctx context.Context, n int) context.Context {
	if n <= 1 {
		return ctx
	}
	return context.WithValue(ctx, shareKey{}, share{n: n, until: time.Now().Add(backstop)})
}

// shareOf is the share of WithShare: one evaluation waited for at most
// backstop from now when ctx has none.
func shareOf(ctx context.Context) share {
	if s, ok := ctx.Value(shareKey{}).(share); ok {
		return s
	}
	return share{n: 1, until: time.Now().Add(backstop)}
}

// backstop is EvalBackstop; tests shorten it to see it end a wait.
var backstop = EvalBackstop

func (b *evalBudget) concat(x, y string) string {
	n := len(x) + len(y)
	if n > b.text {
		panic(errBuiltTooMuch)
	}
	b.text -= n
	return x + y
}

func (b *evalBudget) matches(text, pattern string) bool {
	// Charged first at the pattern's length, before parsing it (which
	// costs about that much and, for a pattern as long as a message, more
	// than the deadline), then at its compiled size, which repetition can
	// make far larger.
	if len(pattern) > MaxExpressionBytes {
		panic(errPatternTooLong) // no written pattern is longer
	}
	b.charge(len(text)+1, len(pattern))
	parsed, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		panic(err)
	}
	// Compiling is charged too, before it is done: a short text makes
	// matching cheap, but a 4 KiB pattern of counted repetitions expands
	// to over half a million instructions, more than a second of CPU.
	b.charge(compileWork, compiledSizeBound(parsed))
	prog, err := syntax.Compile(parsed.Simplify())
	if err != nil {
		panic(err)
	}
	if extra := len(prog.Inst) - len(pattern); extra > 0 {
		b.charge(len(text)+1, extra)
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		panic(err)
	}
	return re.MatchString(text)
}

// compileWork is the regular expression work charged per instruction a
// pattern may compile to (compiledSizeBound): compiling one, twice as
// matches does, costs about as much CPU as stepping a few hundred
// instructions over a byte.
const compileWork = 512

// compiledSizeBound is about the number of instructions re compiles to,
// never far below it, computed from the parsed pattern before its counted
// repetitions are expanded (which is where compiling spends its time).
func compiledSizeBound(re *syntax.Regexp) int {
	n := 1
	for _, sub := range re.Sub {
		n += compiledSizeBound(sub)
	}
	switch re.Op {
	case syntax.OpLiteral:
		n += len(re.Rune)
	case syntax.OpCapture, syntax.OpAlternate:
		n += 2 + len(re.Sub)
	case syntax.OpRepeat:
		count := re.Max
		if count < 0 {
			count = re.Min
		}
		// The parser keeps the product of nested counts at most 1000, so
		// this cannot overflow.
		n = max(count, 1)*n + 1
	}
	return n + 2
}

// checkPattern is the save-time check of a written pattern: it parses, and
// compiling it would fit in one evaluation's budget. It does not compile
// it: the expression is compiled again for every evaluation.
func checkPattern(pattern string) error {
	parsed, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return err
	}
	if size := compiledSizeBound(parsed); size > MaxMatchWork/compileWork {
		return fmt.Errorf("the regular expression %.40q... would compile to about %d instructions, more than one evaluation may (%d)", pattern, size, MaxMatchWork/compileWork)
	}
	return nil
}

// charge takes n times m units of regular expression work.
func (b *evalBudget) charge(n, m int) {
	// Divided rather than multiplied, so huge operands cannot overflow.
	if m > 0 && n > b.match/m {
		panic(errMatchesTooMuch)
	}
	b.match -= n * m
}

// Error is an expression that cannot be compiled or evaluated.
type Error struct {
	Reason string
	Err    error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return "condition: " + e.Reason + ": " + e.Err.Error()
	}
	return "condition: " + e.Reason
}

func (e *Error) Unwrap() error { return e.Err }

// Vars maps variable names (trigger_text, steps_fetch_output_status, ...)
// to their values.
type Vars map[string]string

// Program is a compiled expression.
type Program struct {
	program   *vm.Program
	variables []string // every variable the expression reads, sorted
}

// budgetedOps makes each "in", "contains", "startsWith" and "endsWith" a
// call of the budgeted function (inFunc, containsFunc, ...), like the
// operator overloads of "+" and "matches" but in one pass: every patcher
// costs the compiler a type check of the whole tree per round. A text
// operator is patched only when both operands are known strings (the post
// check refuses the rest), and an "in" not when the library's optimizer
// turns it into two comparisons (a test against a range of constant
// bounds): `str_len(trigger_text) in 1..1000` allocates no range, as
// before. (A list of constants it would make a lookup costs the budgeted
// "in" a few microseconds.)
type budgetedOps struct{}

var textOps = map[string]string{"contains": containsFunc, "startsWith": startsWithFunc, "endsWith": endsWithFunc}

func (budgetedOps) Visit(node *ast.Node) {
	if m, ok := (*node).(*ast.MemberNode); ok {
		if computedMapKey(m) && !m.Optional {
			ast.Patch(node, &ast.CallNode{Callee: &ast.IdentifierNode{Value: fetchFunc}, Arguments: []ast.Node{m.Node, m.Property}})
		}
		return
	}
	b, ok := (*node).(*ast.BinaryNode)
	if !ok {
		return
	}
	fn := ""
	switch {
	case b.Operator == "in" && !optimizedAway(b):
		fn = inFunc
	case textOps[b.Operator] != "" && isString(b.Left.Type()) && isString(b.Right.Type()):
		fn = textOps[b.Operator]
	case compareFuncs[b.Operator] != "" && checked(b.Left) && checked(b.Right) && !readsNothing(b.Left.Type(), b.Right.Type()):
		fn = compareFuncs[b.Operator]
	default:
		return
	}
	ast.Patch(node, &ast.CallNode{Callee: &ast.IdentifierNode{Value: fn}, Arguments: []ast.Node{b.Left, b.Right}})
}

func isString(t reflect.Type) bool { return t != nil && t.Kind() == reflect.String }

// computedMapKey reports whether m looks up a key computed at evaluation
// time (not written, not a number) in what may be a map: the lookup
// hashes the key, reading it through (300 lookups of a 256 KiB text took
// 7 ms). A written key (m.a, m["a"]) is as short as the expression.
func computedMapKey(m *ast.MemberNode) bool {
	if m.Method {
		return false
	}
	switch m.Property.(type) {
	case *ast.StringNode, *ast.IntegerNode:
		return false
	}
	if isNumber(m.Property.Type()) || !checked(m.Node) || !checked(m.Property) {
		return false
	}
	k := m.Node.Type().Kind()
	return k == reflect.Map || k == reflect.Interface
}

// checked reports whether n has a type the checker found: not a nil
// literal (whose comparison reads nothing) and not an operand the checker
// refused, which it types as any. Patched into a comparison's call, a
// refused operand is checked again with the type it got the first time
// and its error is lost (`str_len(1) > 0` compiled). An any is found only
// where a value of a list, a map or a branch is read; any other operand of
// that type is left to the checker, and to unbudgeted should it pass.
func checked(n ast.Node) bool {
	t := n.Type()
	if t == nil {
		return false
	}
	if t.Kind() != reflect.Interface {
		return true
	}
	switch n := n.(type) {
	case *ast.MemberNode, *ast.ChainNode, *ast.IdentifierNode, *ast.ConditionalNode:
		return true
	case *ast.BinaryNode:
		return n.Operator == "??"
	case *ast.CallNode: // a map lookup budgetedOps made a call
		callee, ok := n.Callee.(*ast.IdentifierNode)
		return ok && callee.Value == fetchFunc
	}
	return false
}

// readsNothing reports whether comparing values of types l and r reads
// nothing through: two numbers, or two booleans.
func readsNothing(l, r reflect.Type) bool {
	if isNumber(l) && isNumber(r) {
		return true
	}
	return l != nil && r != nil && l.Kind() == reflect.Bool && r.Kind() == reflect.Bool
}

// optimizedAway reports whether the library's optimizer rewrites in into
// comparisons, on the same conditions as its in_range.
func optimizedAway(in *ast.BinaryNode) bool {
	right, ok := in.Right.(*ast.BinaryNode)
	if !ok || right.Operator != ".." || in.Left.Type() == nil || in.Left.Type().Kind() != reflect.Int {
		return false
	}
	_, from := right.Left.(*ast.IntegerNode)
	_, to := right.Right.(*ast.IntegerNode)
	return from && to
}

// helpers are the functions an expression may call.
var helpers = map[string]bool{"str_contains": true, "str_starts_with": true, "str_ends_with": true, "str_len": true}

// extraFunctions lets tests add helpers (for instance one that blocks).
var extraFunctions []expr.Option

// Compile checks an expression at save time and prepares it for Eval.
func Compile(expression string) (*Program, error) {
	if len(expression) > MaxExpressionBytes {
		return nil, &Error{Reason: fmt.Sprintf("expression is %d bytes, the limit is %d", len(expression), MaxExpressionBytes)}
	}
	if strings.TrimSpace(expression) == "" {
		return nil, &Error{Reason: "expression is empty"}
	}
	// Variables are typed as strings, so the names must be known before
	// type checking: parse once to collect them.
	tree, err := parser.Parse(expression)
	if err != nil {
		return nil, &Error{Reason: "syntax error", Err: err}
	}
	collect := &identifierCollector{}
	ast.Walk(&tree.Node, collect)
	if collect.builtin != "" {
		return nil, &Error{Reason: fmt.Sprintf("builtin %q is not available; the helpers are str_contains, str_starts_with, str_ends_with and str_len", collect.builtin)}
	}
	if name := collect.internal(); name != "" {
		return nil, &Error{Reason: fmt.Sprintf("%q is not available; the helpers are str_contains, str_starts_with, str_ends_with and str_len", name)}
	}
	if err := writtenPatterns(tree.Node); err != nil {
		return nil, err
	}
	env := map[string]any{}
	var variables []string
	for name := range collect.names {
		if collect.called[name] || collect.bound[name] || helpers[name] {
			continue
		}
		if !strings.HasPrefix(name, "trigger_") && !strings.HasPrefix(name, "steps_") {
			return nil, &Error{Reason: fmt.Sprintf("unknown variable %q: variables are trigger_<field> and steps_<id>_output_<field>", name)}
		}
		env[name] = ""
		variables = append(variables, name)
	}
	sort.Strings(variables)
	// The helpers and the budgeted operators: their types; Eval supplies
	// the budget.
	newBudget().env(env)

	opts := []expr.Option{expr.Env(env), expr.AsBool(), expr.DisableAllBuiltins(), expr.MaxNodes(maxNodes),
		expr.Operator("+", concatFunc), expr.Operator("matches", matchesFunc), expr.Patch(budgetedOps{})}
	opts = append(opts, extraFunctions...)
	program, err := expr.Compile(expression, opts...)
	if err != nil {
		return nil, &Error{Reason: "invalid expression", Err: err}
	}
	if err := unbudgeted(program.Node()); err != nil {
		return nil, err
	}
	if loops(program) {
		return nil, &Error{Reason: "the expression compiled to a loop; iteration is not available"}
	}
	return &Program{program: program, variables: variables}, nil
}

// unbudgeted refuses a "+", "matches", "in", text operator or comparison left to the
// library after the budgeted ones replaced those whose operand types are
// known: the library's own would join, match or scan without a budget ("+"
// of two numbers is fine).
func unbudgeted(root ast.Node) error {
	var reason string
	ast.Find(root, func(n ast.Node) bool {
		b, ok := n.(*ast.BinaryNode)
		switch {
		case !ok:
		case b.Operator == "+" && (!isNumber(b.Left.Type()) || !isNumber(b.Right.Type())):
			reason = "+ must join two strings or add two numbers; an operand's type is not known before evaluation"
		case b.Operator == "matches":
			reason = "matches needs two strings; an operand's type is not known before evaluation"
		case b.Operator == "in":
			reason = "in needs a list or a map"
		case b.Operator == "contains" || b.Operator == "startsWith" || b.Operator == "endsWith":
			reason = b.Operator + " needs two strings; an operand's type is not known before evaluation"
		}
		return reason != ""
	})
	if reason == "" { // a comparison's operand may be one of the above: that is the reason
		ast.Find(root, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BinaryNode:
				if compareFuncs[n.Operator] != "" && !readsNothing(n.Left.Type(), n.Right.Type()) && !isNil(n.Left) && !isNil(n.Right) {
					reason = n.Operator + ": an operand's type is not known before evaluation"
				}
			case *ast.MemberNode:
				if n.Optional && computedMapKey(n) {
					reason = "?.[key] of a computed key is not available; write [key]"
				}
			}
			return reason != ""
		})
	}
	if reason != "" {
		return &Error{Reason: reason}
	}
	return nil
}

// loops reports whether a compiled program jumps backward. The iterating
// builtins, the only source of one, are refused before, by name; this
// makes "every instruction runs at most once", which bounds how many an
// evaluation runs, a checked fact of the bytecode, whatever a new version
// of the library compiles to.
func loops(program *vm.Program) bool {
	return slices.Contains(program.Bytecode, vm.OpJumpBackward)
}

// writtenPatterns checks the patterns written after "matches"
// (checkPattern) before the library compiles the expression: its type
// checker compiles such a pattern in each of its passes, and a 4 KiB one
// of counted repetitions took a third of a second each time.
func writtenPatterns(root ast.Node) error {
	var err error
	ast.Find(root, func(n ast.Node) bool {
		if b, ok := n.(*ast.BinaryNode); ok && b.Operator == "matches" {
			if pattern, ok := b.Right.(*ast.StringNode); ok {
				err = checkPattern(pattern.Value)
			}
		}
		return err != nil
	})
	if err != nil {
		return &Error{Reason: "invalid expression: " + err.Error()}
	}
	return nil
}

func isNil(n ast.Node) bool { _, ok := n.(*ast.NilNode); return ok }

func isNumber(t reflect.Type) bool {
	if t == nil {
		return false
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return true
	}
	return false
}

// identifierCollector records the names an expression reads, the names it
// calls, the names it binds itself with let, and the first builtin it uses.
type identifierCollector struct {
	names, called, bound map[string]bool
	builtin              string
}

func (c *identifierCollector) Visit(node *ast.Node) {
	if c.names == nil {
		c.names, c.called, c.bound = map[string]bool{}, map[string]bool{}, map[string]bool{}
	}
	switch n := (*node).(type) {
	case *ast.IdentifierNode:
		c.names[n.Value] = true
	case *ast.CallNode:
		if callee, ok := n.Callee.(*ast.IdentifierNode); ok {
			c.called[callee.Value] = true
		}
	case *ast.VariableDeclaratorNode:
		c.bound[n.Name] = true
	case *ast.BuiltinNode:
		// The tree is walked children first: a builtin replaces the
		// closure found among its arguments.
		if c.builtin == "" || c.builtin == "closure" {
			c.builtin = n.Name
		}
	case *ast.PredicateNode, *ast.PointerNode:
		if c.builtin == "" {
			c.builtin = "closure"
		}
	}
}

// internalPrefix starts the names of the functions the operators compile
// to (concatFunc, inFunc, fetchFunc, compareFuncs, ...). Called by name
// they would skip the checks the operators get (unbudgeted's types, the
// optional lookup of a computed key), so an expression may not name them.
const internalPrefix = "__buzz_"

// internal returns a name the expression uses (read, called or bound)
// that is reserved for the operators' functions, "" if none, the first in
// sorted order so the error is the same every time.
func (c *identifierCollector) internal() string {
	var found []string
	for _, names := range []map[string]bool{c.names, c.called, c.bound} {
		for name := range names {
			if strings.HasPrefix(name, internalPrefix) {
				found = append(found, name)
			}
		}
	}
	if len(found) == 0 {
		return ""
	}
	return slices.Min(found)
}

// Variables lists the variables the expression reads.
func (p *Program) Variables() []string { return slices.Clone(p.variables) }

type evalResult struct {
	value any
	err   error
}

// Eval runs the expression against vars within the work limits, or its
// share of them (WithShare). It waits for the result until ctx ends, and at
// most EvalBackstop: no shorter deadline, since a bounded evaluation must
// not fail because the machine was busy.
func (p *Program) Eval(ctx context.Context, vars Vars) (bool, error) {
	env := make(map[string]any, len(p.variables))
	for _, name := range p.variables {
		v, ok := vars[name]
		if !ok {
			return false, &Error{Reason: fmt.Sprintf("unknown variable %q", name)}
		}
		env[name] = v
	}
	share := shareOf(ctx)
	budget := &evalBudget{text: MaxBuiltBytes / share.n, match: MaxMatchWork / share.n, scan: MaxScanWork / share.n}
	budget.env(env)
	ctx, cancel := context.WithDeadline(ctx, share.until)
	defer cancel()
	if err := ctx.Err(); err != nil {
		return false, &Error{Reason: "evaluation not started", Err: err}
	}

	done := make(chan evalResult, 1) // buffered: a late result never blocks
	go func() {
		// At least 1: a budget of 0 is the VM's default, a million.
		machine := vm.VM{MemoryBudget: max(memoryBudget/uint(share.n), 1)}
		value, err := machine.Run(p.program, env)
		done <- evalResult{value, err}
	}()
	select {
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) && !share.until.After(time.Now()) {
			return false, &Error{Reason: fmt.Sprintf("evaluation still running after the %v backstop", backstop), Err: ctx.Err()}
		}
		return false, &Error{Reason: "evaluation abandoned", Err: ctx.Err()}
	case r := <-done:
		if r.err != nil {
			return false, &Error{Reason: "evaluation failed", Err: r.err}
		}
		b, ok := r.value.(bool)
		if !ok {
			return false, &Error{Reason: fmt.Sprintf("result is %T, not a bool", r.value)}
		}
		return b, nil
	}
}

// standardTriggerFields are the trigger fields every trigger kind may set.
// Any other trigger key came from a webhook body.
var standardTriggerFields = []string{
	"text", "author", "channel_id", "timestamp", "emoji", "message_id", "root_message_id", "parent_message_id",
}

// VarsFrom builds the variables of a run context. Webhook fields go in
// first so that a webhook body cannot replace a standard field, and webhook
// keys that would read like another variable (trigger_..., steps_...) are
// dropped.
func VarsFrom(t template.Context) Vars {
	vars := Vars{}
	webhookKeys := make([]string, 0, len(t.Trigger))
	for key := range t.Trigger {
		if !slices.Contains(standardTriggerFields, key) {
			webhookKeys = append(webhookKeys, key)
		}
	}
	sort.Strings(webhookKeys) // deterministic when two keys map to one name
	for _, key := range webhookKeys {
		if strings.HasPrefix(key, "trigger_") || strings.HasPrefix(key, "steps_") {
			continue
		}
		vars["trigger_"+dotsToUnderscores(key)] = t.Trigger[key]
	}
	for _, key := range standardTriggerFields {
		if v, ok := t.Trigger[key]; ok {
			vars["trigger_"+key] = v
		}
	}
	for id, output := range t.Steps {
		for field, value := range output {
			s, err := template.ValueString(value)
			if err != nil {
				continue
			}
			vars["steps_"+dotsToUnderscores(id)+"_output_"+dotsToUnderscores(field)] = s
		}
	}
	return vars
}

func dotsToUnderscores(s string) string { return strings.ReplaceAll(s, ".", "_") }

// IsError reports whether err came from this package.
func IsError(err error) bool {
	var e *Error
	return errors.As(err, &e)
}
