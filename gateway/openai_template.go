package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/ardanlabs/jinja"

	"github.com/skein-ai/skein/api"
)

// Chat requests are rendered with the model's own chat template, the Jinja template of its
// tokenizer_config.json, as Hugging Face's apply_chat_template does, then tokenized as text
// (the template writes the BOS and turn markers itself).

// MaxChatMessages bounds the messages of one chat request; every message is a loop iteration
// of the template (and of Qwen's, two).
const MaxChatMessages = 4096

// MaxChatBytes bounds the content bytes of one chat request's messages together, and
// MaxChatPromptBytes what its template may render from them.
const (
	MaxChatBytes       = 8 << 20
	MaxChatPromptBytes = 16 << 20
)

// DefaultChatTemplateTimeout is how long a render is waited on (--chat-template-timeout).
const DefaultChatTemplateTimeout = 2 * time.Second

// chatTemplate is a compiled chat template with the special tokens it may refer to.
type chatTemplate struct {
	tmpl     *jinja.Template
	bos, eos string
}

type chatTemplateCache struct {
	mu    sync.Mutex
	byDir map[string]*chatTemplate // by baseFiles.key; nil entry: the model has no chat template
}

// chatTemplates keeps each model directory's compiled template: its files do not change while
// it is served.
var chatTemplates = &chatTemplateCache{byDir: map[string]*chatTemplate{}}

var errNoChatTemplate = errors.New("no chat template")

func (c *chatTemplateCache) get(ctx context.Context, f baseFiles) (*chatTemplate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	dir := f.key
	if t, ok := c.byDir[dir]; ok {
		if t == nil {
			return nil, errNoChatTemplate
		}
		return t, nil
	}
	b, err := f.read(ctx, tokenizerConfigFile)
	if errors.Is(err, errNoTokenizerFile) {
		if !strings.HasPrefix(dir, "storage:") { // a worker may publish it later
			c.byDir[dir] = nil
		}
		return nil, errNoChatTemplate
	}
	if err != nil {
		return nil, err
	}
	t, err := parseChatTemplate(b)
	if errors.Is(err, errNoChatTemplate) {
		c.byDir[dir] = nil
	}
	if err != nil {
		return nil, err
	}
	c.byDir[dir] = t
	return t, nil
}

// parseChatTemplate reads the template out of a tokenizer_config.json: chat_template is a
// string, or a list of named templates of which "default" is the one for chat.
func parseChatTemplate(config []byte) (*chatTemplate, error) {
	var cfg struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
		BOS          json.RawMessage `json:"bos_token"`
		EOS          json.RawMessage `json:"eos_token"`
	}
	if err := json.Unmarshal(config, &cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", tokenizerConfigFile, err)
	}
	var src string
	if err := json.Unmarshal(cfg.ChatTemplate, &src); err != nil {
		var named []struct{ Name, Template string }
		if json.Unmarshal(cfg.ChatTemplate, &named) == nil {
			for _, n := range named {
				if n.Name == "default" {
					src = n.Template
				}
			}
		}
	}
	if src == "" {
		return nil, errNoChatTemplate
	}
	if err := vetSource(src); err != nil {
		return nil, fmt.Errorf("the model's chat template: %w", err)
	}
	tmpl, err := jinja.Compile(src)
	if err != nil {
		return nil, fmt.Errorf("the model's chat template: %w", err)
	}
	if err := vetTemplate(tmpl); err != nil {
		return nil, fmt.Errorf("the model's chat template: %w", err)
	}
	return &chatTemplate{tmpl: tmpl, bos: specialToken(cfg.BOS), eos: specialToken(cfg.EOS)}, nil
}

// specialToken reads a token of tokenizer_config.json: a string or {"content": ...}.
func specialToken(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var added struct{ Content string }
	if json.Unmarshal(raw, &added) == nil {
		return added.Content
	}
	return ""
}

// chatRoles are the roles a message may have; OpenAI's "developer" is its newer name for system.
var chatRoles = map[string]string{"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}

// render writes the conversation as the model's prompt text, ending with the assistant's turn,
// within the bounds of template_vet.go: it waits at most timeout, and only while ctx lives.
func (t *chatTemplate) render(ctx context.Context, timeout time.Duration, msgs []api.ChatMessage) (string, error) {
	if len(msgs) == 0 {
		return "", badParam("messages", "messages must hold at least one message")
	}
	if len(msgs) > MaxChatMessages {
		return "", badParam("messages", fmt.Sprintf("%d messages, at most %d", len(msgs), MaxChatMessages))
	}
	list := make([]jinja.Value, len(msgs))
	size := 0
	for i, m := range msgs {
		role, ok := chatRoles[m.Role]
		if !ok {
			return "", badParam(fmt.Sprintf("messages[%d].role", i), fmt.Sprintf("role %q: this server takes system, user and assistant messages", m.Role))
		}
		content, err := m.Text()
		if err != nil {
			return "", badParam(fmt.Sprintf("messages[%d].content", i), err.Error())
		}
		if size += len(content); size > MaxChatBytes {
			return "", badParam(fmt.Sprintf("messages[%d].content", i), fmt.Sprintf("the conversation is over %d bytes", MaxChatBytes))
		}
		msg := jinja.NewDict() // keys in FromGoValue's sorted order, as before
		msg.AsDict().Set("content", jinja.NewString(content))
		msg.AsDict().Set("role", jinja.NewString(role))
		list[i] = msg
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	select { // a slot is held until the render really ends, even one no longer waited on
	case renderSlots <- struct{}{}:
	case <-ctx.Done():
		return "", renderStopped(ctx, timeout)
	}
	vals := map[string]jinja.Value{"messages": jinja.NewList(list), "add_generation_prompt": jinja.NewBool(true),
		"bos_token": jinja.NewString(t.bos), "eos_token": jinja.NewString(t.eos), "range": boundedRange(ctx)}
	type result struct {
		text string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		defer func() { <-renderSlots }()
		// A template is the operator's, but a bug in the Jinja engine on some input must stay
		// this request's error.
		defer func() {
			if v := recover(); v != nil {
				done <- result{err: fmt.Errorf("rendering the chat template: %v", v)}
			}
		}()
		text, err := t.tmpl.RenderValues(vals)
		done <- result{text, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			if ctx.Err() != nil { // the server's range stopped it
				return "", renderStopped(ctx, timeout)
			}
			// raise_exception in a template is how it refuses a conversation (e.g. roles out of order).
			return "", badParam("messages", fmt.Sprintf("the model's chat template refused the conversation: %v", r.err))
		}
		if len(r.text) > MaxChatPromptBytes {
			return "", badParam("messages", fmt.Sprintf("the chat template's output is %d bytes, at most %d", len(r.text), MaxChatPromptBytes))
		}
		return r.text, nil
	case <-ctx.Done():
		return "", renderStopped(ctx, timeout)
	}
}

// renderStopped is the error of a render whose deadline passed (a 400: this conversation is too
// much for this template) or whose request was cancelled (context.Canceled).
func renderStopped(ctx context.Context, timeout time.Duration) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return badParam("messages", fmt.Sprintf("the model's chat template did not finish within %s on this conversation (--chat-template-timeout)", timeout))
	}
	return ctx.Err()
}

// renderSlots bounds the renders running at once, abandoned ones included.
var renderSlots = make(chan struct{}, max(1, runtime.GOMAXPROCS(0)))

// boundedRange is Jinja's range() with bounds: each call at most MaxTemplateRange items, all
// calls of one render at most MaxTemplateSteps, and none once ctx is done (which ends a render
// that loops over range after it stopped being waited on).
func boundedRange(ctx context.Context) jinja.Value {
	steps := 0
	return jinja.NewCallable("range", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if err := ctx.Err(); err != nil {
			return jinja.Undefined(), fmt.Errorf("render stopped: %w", err)
		}
		var b [3]int64
		b[2] = 1
		for i, a := range args {
			switch {
			case len(args) > 3:
				return jinja.Undefined(), fmt.Errorf("range: expected 1-3 arguments, got %d", len(args))
			case a.IsInt():
				b[i] = a.AsInt()
			case a.IsFloat() && a.AsFloat() == float64(int64(a.AsFloat())):
				b[i] = int64(a.AsFloat())
			default:
				return jinja.Undefined(), fmt.Errorf("range: argument %d is not an integer", i+1)
			}
		}
		start, stop, step := b[0], b[1], b[2]
		if len(args) == 1 {
			start, stop = 0, b[0]
		}
		if len(args) == 0 || step == 0 {
			return jinja.Undefined(), errors.New("range: needs a bound and a non-zero step")
		}
		const far = 1 << 40 // keeps the arithmetic below from overflowing
		if start < -far || start > far || stop < -far || stop > far || step < -far || step > far {
			return jinja.Undefined(), fmt.Errorf("range: bounds past ±2^40")
		}
		n := int64(0)
		if step > 0 && stop > start {
			n = (stop - start + step - 1) / step
		} else if step < 0 && stop < start {
			n = (start - stop - step - 1) / -step
		}
		if n > MaxTemplateRange {
			return jinja.Undefined(), fmt.Errorf("range: %d items, at most %d", n, MaxTemplateRange)
		}
		if steps += int(n); steps > MaxTemplateSteps {
			return jinja.Undefined(), fmt.Errorf("the template's range() calls made over %d steps together", MaxTemplateSteps)
		}
		items := make([]jinja.Value, n)
		for i := range items {
			items[i] = jinja.NewInt(start + int64(i)*step)
		}
		return jinja.NewList(items), nil
	})
}
