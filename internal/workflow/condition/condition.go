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
//     instruction runs at most once and evaluation takes time proportional
//     to the expression size times the size of the values;
//   - an expression is at most 4096 bytes and its syntax tree is capped, and
//     the range operator ("1..n", the only way left to build a large value)
//     is bounded by the VM's memory budget;
//   - evaluation still runs under a 100 ms deadline: it runs on its own
//     goroutine and Eval returns when the deadline passes, even if the
//     (bounded) work has not finished, so one slow condition cannot stall a
//     trigger pipeline;
//   - a variable that does not exist at evaluation time is an error, not a
//     silent false, so a typo in a filter is reported rather than ignored.
package condition

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/parser"
	"github.com/expr-lang/expr/vm"

	"github.com/buzzrelay/buzz/internal/workflow/template"
)

const (
	// MaxExpressionBytes bounds what an owner can store and what the
	// compiler has to chew on.
	MaxExpressionBytes = 4096
	// EvalTimeout is the most one evaluation may take.
	EvalTimeout = 100 * time.Millisecond
	// maxNodes caps the syntax tree; 4096 bytes cannot need more.
	maxNodes = 2048
	// memoryBudget caps the elements that range expressions may allocate in
	// one evaluation.
	memoryBudget = 10000
)

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

// functions are the helpers an expression may call.
var functions = []expr.Option{
	expr.Function("str_contains", func(p ...any) (any, error) {
		return strings.Contains(p[0].(string), p[1].(string)), nil
	}, new(func(string, string) bool)),
	expr.Function("str_starts_with", func(p ...any) (any, error) {
		return strings.HasPrefix(p[0].(string), p[1].(string)), nil
	}, new(func(string, string) bool)),
	expr.Function("str_ends_with", func(p ...any) (any, error) {
		return strings.HasSuffix(p[0].(string), p[1].(string)), nil
	}, new(func(string, string) bool)),
	// str_len counts characters, not bytes, like the truncate filter.
	expr.Function("str_len", func(p ...any) (any, error) {
		return utf8.RuneCountInString(p[0].(string)), nil
	}, new(func(string) int)),
}

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
	env := map[string]any{}
	var variables []string
	for name := range collect.names {
		if collect.called[name] || collect.bound[name] {
			continue
		}
		if !strings.HasPrefix(name, "trigger_") && !strings.HasPrefix(name, "steps_") {
			return nil, &Error{Reason: fmt.Sprintf("unknown variable %q: variables are trigger_<field> and steps_<id>_output_<field>", name)}
		}
		env[name] = ""
		variables = append(variables, name)
	}
	sort.Strings(variables)

	opts := []expr.Option{expr.Env(env), expr.AsBool(), expr.DisableAllBuiltins(), expr.MaxNodes(maxNodes)}
	opts = append(opts, functions...)
	opts = append(opts, extraFunctions...)
	program, err := expr.Compile(expression, opts...)
	if err != nil {
		return nil, &Error{Reason: "invalid expression", Err: err}
	}
	return &Program{program: program, variables: variables}, nil
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

// Variables lists the variables the expression reads.
func (p *Program) Variables() []string { return slices.Clone(p.variables) }

type evalResult struct {
	value any
	err   error
}

// Eval runs the expression against vars within EvalTimeout (or ctx's
// earlier deadline).
func (p *Program) Eval(ctx context.Context, vars Vars) (bool, error) {
	env := make(map[string]any, len(p.variables))
	for _, name := range p.variables {
		v, ok := vars[name]
		if !ok {
			return false, &Error{Reason: fmt.Sprintf("unknown variable %q", name)}
		}
		env[name] = v
	}
	ctx, cancel := context.WithTimeout(ctx, EvalTimeout)
	defer cancel()
	if err := ctx.Err(); err != nil {
		return false, &Error{Reason: "evaluation not started", Err: err}
	}

	done := make(chan evalResult, 1) // buffered: a late result never blocks
	go func() {
		machine := vm.VM{MemoryBudget: memoryBudget}
		value, err := machine.Run(p.program, env)
		done <- evalResult{value, err}
	}()
	select {
	case <-ctx.Done():
		return false, &Error{Reason: "evaluation exceeded its time budget", Err: ctx.Err()}
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
