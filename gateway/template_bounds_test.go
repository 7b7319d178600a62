package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/skein-ai/skein/api"
)

func templateConfig(src string) []byte {
	b, _ := json.Marshal(map[string]any{"chat_template": src, "eos_token": "</s>"})
	return b
}

// TestHostileChatTemplatesAreRefused (issue 19): the three templates an auditor used to take the
// process down are refused when the template is loaded, with an error that says why. On the old
// code all three compiled, and rendering them ended the process (a self-calling macro: "fatal
// error: stack overflow"; 'x' * 1000000000: "fatal error: out of memory") or never returned
// (nested range(100000)); so this test only renders what loaded, never the attacks.
func TestHostileChatTemplatesAreRefused(t *testing.T) {
	for _, c := range []struct{ name, src, want string }{
		{"self-calling macro", `{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}`, "recursive"},
		{"macros calling each other", `{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}`, "recursive"},
		{"a macro passed as a value", `{% macro a(g) %}{{ g(g) }}{% endmacro %}{{ a(a) }}`, "value"},
		{"a recursive loop", `{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}`, "recursive"},
		{"nested range(100000)", `{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}`, "range"},
		{"string repetition", `{{ 'x' * 1000000000 }}`, "*"},
		{"repetition by a variable", `{% set n = messages|length %}{{ 'x' * n }}`, "*"},
		{"deep nesting", strings.Repeat("{{ (", 1) + strings.Repeat("(", 100000) + "1" + strings.Repeat(")", 100001) + " }}", "nest"},
	} {
		tmpl, err := parseChatTemplate(templateConfig(c.src))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: loaded (%v), want it refused naming %q", c.name, err, c.want)
			continue
		}
		_ = tmpl
	}
	// What real templates do still loads: macros calling macros, a short literal repetition,
	// range over the conversation.
	ok := `{% macro inner(x) %}[{{ x }}]{% endmacro %}{% macro outer(x) %}{{ inner(x) }}{% endmacro %}` +
		`{{ '-' * 3 }}{% for i in range(messages|length) %}{{ outer(messages[i].content) }}{% endfor %}`
	tmpl, err := parseChatTemplate(templateConfig(ok))
	if err != nil {
		t.Fatalf("a benign template: %v", err)
	}
	got, err := tmpl.render(context.Background(), time.Minute, []api.ChatMessage{msg("user", "a"), msg("assistant", "b")})
	if err != nil || got != "---[a][b]" {
		t.Fatalf("rendered %q, %v", got, err)
	}
}

// TestChatTemplateRenderIsBounded (issue 19): what static checks let through is bounded while it
// runs. range() is the server's own: each call at most MaxTemplateRange items and all calls of a
// render at most MaxTemplateSteps; a render past the deadline or whose request is cancelled
// stops being waited on at once (the old code waited as long as it ran); the conversation's size
// and the output's size are bounded.
func TestChatTemplateRenderIsBounded(t *testing.T) {
	user := []api.ChatMessage{msg("user", "hi")}
	steps := `{% for i in range(4000) %}{% for j in range(4000) %}{% endfor %}{% endfor %}`
	tmpl, err := parseChatTemplate(templateConfig(steps))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmpl.render(context.Background(), time.Minute, user); err == nil || !strings.Contains(err.Error(), "steps") {
		t.Fatalf("16M range items: %v, want the steps bound", err)
	}
	dyn := `{% for i in range(messages[0].content|length) %}{% endfor %}`
	tmpl, _ = parseChatTemplate(templateConfig(dyn))
	if _, err := tmpl.render(context.Background(), time.Minute, []api.ChatMessage{msg("user", strings.Repeat("x", MaxTemplateRange+1))}); err == nil || !strings.Contains(err.Error(), "range") {
		t.Fatalf("range past MaxTemplateRange: %v", err)
	}

	// Nested loops over the content (no range): slow, and only the deadline stops the wait.
	slow := `{% for m in messages %}{% for a in m.content %}{% for b in m.content %}{% endfor %}{% endfor %}{% endfor %}`
	tmpl, err = parseChatTemplate(templateConfig(slow))
	if err != nil {
		t.Fatal(err)
	}
	long := []api.ChatMessage{msg("user", strings.Repeat("y", 800))}
	start := time.Now()
	_, err = tmpl.render(context.Background(), 50*time.Millisecond, long)
	if err == nil || !strings.Contains(err.Error(), "did not finish") {
		t.Fatalf("a slow render: %v, want the deadline's error", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the deadline took %s", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	if _, err := tmpl.render(ctx, time.Minute, long); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled render: %v, want context.Canceled", err)
	}

	// Inputs and output.
	echo, _ := parseChatTemplate(templateConfig(`{% for m in messages %}{{ m.content }}{% endfor %}`))
	big := []api.ChatMessage{msg("user", strings.Repeat("z", MaxChatBytes/2)), msg("user", strings.Repeat("z", MaxChatBytes/2+1))}
	if _, err := echo.render(context.Background(), time.Minute, big); err == nil || !strings.Contains(err.Error(), "bytes") {
		t.Fatalf("a conversation over MaxChatBytes: %v", err)
	}
	many := `{% for m in messages %}{% for i in range(4000) %}{{ m.content }}{% endfor %}{% endfor %}`
	tmpl, _ = parseChatTemplate(templateConfig(many))
	if _, err := tmpl.render(context.Background(), time.Minute, []api.ChatMessage{msg("user", strings.Repeat("w", 8<<10))}); err == nil || !strings.Contains(err.Error(), "output") {
		t.Fatalf("an output over MaxChatPromptBytes: %v", err)
	}
}
