package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/ardanlabs/jinja"

	"github.com/skein-ai/skein/api"
)

// Chat requests are rendered with the model's own chat template, the Jinja template of its
// tokenizer_config.json, as Hugging Face's apply_chat_template does, then tokenized as text
// (the template writes the BOS and turn markers itself).

// MaxChatMessages bounds the messages of one chat request; every message is a loop iteration
// of the template (and of Qwen's, two).
const MaxChatMessages = 4096

// chatTemplate is a compiled chat template with the special tokens it may refer to.
type chatTemplate struct {
	tmpl     *jinja.Template
	bos, eos string
}

type chatTemplateCache struct {
	mu    sync.Mutex
	byDir map[string]*chatTemplate // nil entry: the model has no chat template
}

// chatTemplates keeps each model directory's compiled template: its files do not change while
// it is served.
var chatTemplates = &chatTemplateCache{byDir: map[string]*chatTemplate{}}

var errNoChatTemplate = errors.New("no chat template")

func (c *chatTemplateCache) get(dir string) (*chatTemplate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t, ok := c.byDir[dir]; ok {
		if t == nil {
			return nil, errNoChatTemplate
		}
		return t, nil
	}
	b, err := readTokenizerFile(dir, tokenizerConfigFile)
	if errors.Is(err, errNoTokenizerFile) {
		c.byDir[dir] = nil
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
	tmpl, err := jinja.Compile(src)
	if err != nil {
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

// render writes the conversation as the model's prompt text, ending with the assistant's turn.
func (t *chatTemplate) render(msgs []api.ChatMessage) (text string, err error) {
	if len(msgs) == 0 {
		return "", badParam("messages", "messages must hold at least one message")
	}
	if len(msgs) > MaxChatMessages {
		return "", badParam("messages", fmt.Sprintf("%d messages, at most %d", len(msgs), MaxChatMessages))
	}
	list := make([]any, len(msgs))
	for i, m := range msgs {
		role, ok := chatRoles[m.Role]
		if !ok {
			return "", badParam(fmt.Sprintf("messages[%d].role", i), fmt.Sprintf("role %q: this server takes system, user and assistant messages", m.Role))
		}
		content, err := m.Text()
		if err != nil {
			return "", badParam(fmt.Sprintf("messages[%d].content", i), err.Error())
		}
		list[i] = map[string]any{"role": role, "content": content}
	}
	// A template is the operator's, but a bug in the Jinja engine on some input must stay this
	// request's error.
	defer func() {
		if v := recover(); v != nil {
			text, err = "", fmt.Errorf("rendering the chat template: %v", v)
		}
	}()
	out, err := t.tmpl.Render(map[string]any{"messages": list, "add_generation_prompt": true,
		"bos_token": t.bos, "eos_token": t.eos})
	if err != nil {
		// raise_exception in a template is how it refuses a conversation (e.g. roles out of order).
		return "", badParam("messages", fmt.Sprintf("the model's chat template refused the conversation: %v", err))
	}
	return out, nil
}
