package gateway

// Bounds on chat templates (issue 19). The Jinja engine (github.com/ardanlabs/jinja) has no
// options, context or limits, and some templates can end the process in ways recover cannot
// catch (a stack overflow, an out-of-memory). So a template is vetted once, when it is loaded,
// by walking its syntax tree, and every render runs within bounds the server sets:
//
//   - at load: the source's size and bracket nesting (the parser recurses); no recursion (a
//     macro calling itself through any chain of macros, a macro or caller used as a value, a
//     `recursive` loop); `*` only between literals, with a bounded result (string repetition);
//     range() with literal bounds only up to MaxTemplateRange.
//   - at render: the conversation's messages and bytes; range() is the server's own, each call
//     at most MaxTemplateRange items and all of a render's calls at most MaxTemplateSteps, and it
//     stops a render whose deadline passed or whose request went; the render runs in its own
//     goroutine, waited on for at most the timeout (--chat-template-timeout) and only while the
//     request lives; at most GOMAXPROCS renders run at once, a slot held until a render really
//     ends, so abandoned renders cannot pile up; the output is refused past MaxChatPromptBytes.
//
// The engine's syntax tree is unexported; it is read with reflect, and a tree whose shape this
// code does not know is refused rather than trusted (vetWorks: the walk must still catch its
// canaries, or every template is refused).

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"github.com/ardanlabs/jinja"
)

const (
	// MaxTemplateSource bounds a chat template's source.
	MaxTemplateSource = 1 << 20
	// MaxTemplateNesting bounds the nesting of brackets in a template's source: the engine's
	// parser recurses on each level.
	MaxTemplateNesting = 256
	// MaxTemplateRange bounds one range() call's items: a conversation's messages at most.
	MaxTemplateRange = MaxChatMessages
	// MaxTemplateSteps bounds the items all range() calls of one render make together.
	MaxTemplateSteps = 1 << 20
	// maxTemplateRepeat bounds the string a literal repetition ('-' * 80) may make.
	maxTemplateRepeat = 64 << 10
)

// vetSource refuses a source too large or nested too deep for the engine's recursive parser.
func vetSource(src string) error {
	if len(src) > MaxTemplateSource {
		return fmt.Errorf("the chat template is %d bytes, at most %d", len(src), MaxTemplateSource)
	}
	depth := 0
	for _, c := range src { // brackets inside strings count too: a conservative bound
		switch c {
		case '(', '[', '{':
			if depth++; depth > MaxTemplateNesting {
				return fmt.Errorf("the chat template nests brackets deeper than %d", MaxTemplateNesting)
			}
		case ')', ']', '}':
			depth = max(0, depth-1)
		}
	}
	return nil
}

// vetter walks a compiled template's syntax tree.
type vetter struct {
	macros map[string]bool            // every macro the template defines
	calls  map[string]map[string]bool // macro -> macros its body calls
	err    error
}

// vetTemplate refuses what could recurse without bound, repeat a string past
// maxTemplateRepeat, or ask range() for more than MaxTemplateRange items (see the package
// comment above).
func vetTemplate(t *jinja.Template) (err error) {
	if !vetWorks() {
		return errUncheckable
	}
	defer func() { // reflect panics on a tree of another shape: refuse, never trust
		if v := recover(); v != nil {
			err = errUncheckable
		}
	}()
	return vetTree(t)
}

var errUncheckable = errors.New("the chat template cannot be checked (unknown jinja syntax tree): refused")

// vetWorks says whether the walk still understands the engine's tree: it must refuse the
// attacks it exists for. Were the engine to rename its nodes, the walk would see nothing, and
// every template is refused instead of trusted.
var vetWorks = sync.OnceValue(func() bool {
	for _, src := range []string{`{% macro f() %}{{ f() }}{% endmacro %}`, `{{ 'x' * n }}`,
		`{% for m in messages recursive %}{% endfor %}`, `{{ range(100000) }}`, `{% macro f() %}{% endmacro %}{{ [f] }}`} {
		t, err := jinja.Compile(src)
		if err != nil {
			return false
		}
		ok := func() (ok bool) {
			defer func() {
				if recover() != nil {
					ok = false
				}
			}()
			return vetTree(t) != nil
		}()
		if !ok {
			return false
		}
	}
	return true
})

func vetTree(t *jinja.Template) error {
	root := reflect.ValueOf(t).Elem().FieldByName("nodes")
	if !root.IsValid() || root.Kind() != reflect.Slice {
		return errUncheckable
	}
	v := &vetter{macros: map[string]bool{}, calls: map[string]map[string]bool{}}
	v.collect(root)
	v.walk(root, "", false)
	if v.err != nil {
		return v.err
	}
	// A cycle in the calls between macros is recursion.
	state := map[string]int{} // 1: on the path, 2: done
	var visit func(m string, path []string) error
	visit = func(m string, path []string) error {
		switch state[m] {
		case 1:
			return fmt.Errorf("the chat template is recursive: macro %s", strings.Join(append(path, m), " → "))
		case 2:
			return nil
		}
		state[m] = 1
		for c := range v.calls[m] {
			if err := visit(c, append(path, m)); err != nil {
				return err
			}
		}
		state[m] = 2
		return nil
	}
	for m := range v.macros {
		if err := visit(m, nil); err != nil {
			return err
		}
	}
	return nil
}

// nodeName is the engine's type name of a syntax-tree node ("macroNode", "nameExpr", ...).
func nodeName(n reflect.Value) string {
	for n.Kind() == reflect.Interface || n.Kind() == reflect.Pointer {
		if n.IsNil() {
			return ""
		}
		n = n.Elem()
	}
	return n.Type().Name()
}

// deref is the struct behind an interface or pointer (an invalid Value for nil).
func deref(n reflect.Value) reflect.Value {
	for n.Kind() == reflect.Interface || n.Kind() == reflect.Pointer {
		if n.IsNil() {
			return reflect.Value{}
		}
		n = n.Elem()
	}
	return n
}

// collect records every macro's name, wherever it is defined.
func (v *vetter) collect(n reflect.Value) {
	n = deref(n)
	if !n.IsValid() {
		return
	}
	switch n.Kind() {
	case reflect.Slice:
		for i := range n.Len() {
			v.collect(n.Index(i))
		}
	case reflect.Struct:
		if n.Type().Name() == "macroNode" {
			v.macros[n.FieldByName("name").String()] = true
		}
		if n.Type().Name() == "Value" || n.Type().Name() == "litExpr" {
			return
		}
		for i := range n.NumField() {
			v.collect(n.Field(i))
		}
	}
}

func (v *vetter) fail(format string, args ...any) {
	if v.err == nil {
		v.err = fmt.Errorf(format, args...)
	}
}

// walk checks node n inside macro (empty: at top level); callee says n is the function of a
// call, where a macro's or caller's name is allowed.
func (v *vetter) walk(n reflect.Value, macro string, callee bool) {
	n = deref(n)
	if !n.IsValid() || v.err != nil {
		return
	}
	switch n.Kind() {
	case reflect.Slice:
		for i := range n.Len() {
			v.walk(n.Index(i), macro, false)
		}
		return
	case reflect.Struct:
	default:
		return
	}
	switch n.Type().Name() {
	case "litExpr", "Value":
		return
	case "macroNode":
		name := n.FieldByName("name").String()
		v.walk(n.FieldByName("params"), name, false)
		v.walk(n.FieldByName("body"), name, false)
		return
	case "nameExpr":
		name := n.FieldByName("name").String()
		if !callee && (v.macros[name] || name == "caller") {
			v.fail("the chat template uses %s as a value: a macro may only be called, so that the template cannot recurse", name)
		}
		return
	case "forNode":
		if f := n.FieldByName("recursive"); f.IsValid() && f.Bool() {
			v.fail("the chat template has a recursive loop: refused, it could recurse without bound")
			return
		}
	case "binExpr":
		if n.FieldByName("op").String() == "*" {
			v.checkRepeat(n.FieldByName("left"), n.FieldByName("right"))
		}
	case "callExpr":
		fn := n.FieldByName("fn")
		if nodeName(fn) == "nameExpr" {
			name := deref(fn).FieldByName("name").String()
			if v.macros[name] {
				if v.calls[macro] == nil {
					v.calls[macro] = map[string]bool{}
				}
				v.calls[macro][name] = true
			}
			if name == "range" {
				v.checkRange(n.FieldByName("args"))
			}
			v.walk(n.FieldByName("args"), macro, false)
			v.walk(n.FieldByName("kwargs"), macro, false)
			return
		}
	}
	for i := range n.NumField() {
		v.walk(n.Field(i), macro, false)
	}
}

// literal reads a litExpr's value: its kind (jinja.Kind) and, for ints and strings, the value.
func literal(n reflect.Value) (kind jinja.Kind, i int64, s string, ok bool) {
	if nodeName(n) != "litExpr" {
		return 0, 0, "", false
	}
	val := deref(n).FieldByName("val")
	if !val.IsValid() {
		return 0, 0, "", false
	}
	kind = jinja.Kind(val.FieldByName("kind").Int())
	x := deref(val.FieldByName("v"))
	switch {
	case kind == jinja.KindInt && x.IsValid() && x.Kind() == reflect.Int64:
		i = x.Int()
	case kind == jinja.KindString && x.IsValid() && x.Kind() == reflect.String:
		s = x.String()
	case kind == jinja.KindFloat || kind == jinja.KindBool || kind == jinja.KindNone:
	default:
		return 0, 0, "", false
	}
	return kind, i, s, true
}

// checkRepeat allows a * b only between literals whose product is bounded: a repetition of a
// string by anything not known at load could ask for any size.
func (v *vetter) checkRepeat(a, b reflect.Value) {
	ka, ia, sa, oka := literal(a)
	kb, ib, sb, okb := literal(b)
	if !oka || !okb {
		v.fail("the chat template uses * on a value not known when it is loaded: refused, a string repeated by it could be any size")
		return
	}
	if ka == jinja.KindString && kb == jinja.KindInt && (ib < 0 || ib > maxTemplateRepeat || int64(len(sa))*ib > maxTemplateRepeat) ||
		kb == jinja.KindString && ka == jinja.KindInt && (ia < 0 || ia > maxTemplateRepeat || int64(len(sb))*ia > maxTemplateRepeat) {
		v.fail("the chat template repeats a string (*) past %d bytes", maxTemplateRepeat)
	}
}

// checkRange refuses range() with a literal bound past MaxTemplateRange (other bounds are
// checked by the server's range at render).
func (v *vetter) checkRange(args reflect.Value) {
	for i := range args.Len() {
		if k, x, _, ok := literal(args.Index(i)); ok && k == jinja.KindInt && (x > MaxTemplateRange || x < -MaxTemplateRange) {
			v.fail("the chat template calls range() with bound %d, at most %d", x, MaxTemplateRange)
		}
	}
}
