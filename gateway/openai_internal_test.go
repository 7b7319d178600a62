package gateway

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/engine/tokenizer"
)

func msg(role, content string) api.ChatMessage {
	b, _ := json.Marshal(content)
	return api.ChatMessage{Role: role, Content: b}
}

// Qwen3's own chat template (testdata, as its tokenizer_config.json ships it) renders through the
// Jinja engine: its namespace, reversed loop, startswith/endswith, split/strip and the thinking
// of an earlier assistant turn dropped, as Hugging Face renders it.
func TestQwen3ChatTemplateRenders(t *testing.T) {
	src, err := os.ReadFile("testdata/qwen3_chat_template.jinja")
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(map[string]any{"chat_template": string(src), "eos_token": "<|im_end|>",
		"bos_token": nil})
	tmpl, err := parseChatTemplate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tmpl.render(context.Background(), time.Minute, []api.ChatMessage{msg("system", "Be brief."), msg("user", "Hi"),
		msg("assistant", "<think>\nThe user greets.\n</think>\n\nHello!"), msg("user", "Bye")})
	if err != nil {
		t.Fatal(err)
	}
	want := "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n" +
		"<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
	if got != want {
		t.Fatalf("rendered\n%q\nwant\n%q", got, want)
	}
	// tojson, which the template uses for tools.
	j, err := jinja.Compile(string(src))
	if err != nil {
		t.Fatal(err)
	}
	out, err := j.Render(map[string]any{"messages": []any{map[string]any{"role": "user", "content": "x"}},
		"tools": []any{map[string]any{"name": "lookup", "parameters": map[string]any{"q": "string"}}}, "add_generation_prompt": true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "<tools>\n{") || !strings.Contains(out, `"name": "lookup"`) {
		t.Fatalf("tools rendered as %q", out)
	}
	// The roles the API does not serve, and templates that refuse a conversation, are 400s.
	if _, err := tmpl.render(context.Background(), time.Minute, []api.ChatMessage{msg("tool", "x")}); err == nil {
		t.Fatal("a tool message was rendered")
	}
	bad, _ := parseChatTemplate([]byte(`{"chat_template": "{{ raise_exception('roles must alternate') }}"}`))
	if _, err := bad.render(context.Background(), time.Minute, []api.ChatMessage{msg("user", "x")}); err == nil || !strings.Contains(err.Error(), "roles must alternate") {
		t.Fatalf("raise_exception: %v", err)
	}
	if _, err := parseChatTemplate([]byte(`{"eos_token": "</s>"}`)); err != errNoChatTemplate {
		t.Fatalf("no template: %v", err)
	}
}

func tinyTokenizer(t *testing.T) *tokenizer.Tokenizer {
	dir := t.TempDir()
	if err := engine.InitTiny(dir, engine.ArchQwen3, "tiny", 1); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// Streamed text goes out in whole UTF-8 characters even where the tokenizer splits one across
// byte tokens, holds back what may begin a stop string, and ends before the stop string; the
// pieces add up to the whole answer.
func TestChoiceStreamCutsAtCharactersAndStops(t *testing.T) {
	tok := tinyTokenizer(t)
	imEnd, _ := tok.TokenID("<|im_end|>")
	text := "naïve café — 日本語 and then STOP and more"
	ids := tok.Encode(text)
	split := 0
	for _, id := range ids {
		if !utf8.ValidString(tok.Decode([]int{id})) {
			split++
		}
	}
	if split == 0 {
		t.Fatal("the test text has no token that cuts a character: it tests nothing")
	}
	c := &choiceStream{tok: tok, stops: []string{"STOP"}, hold: 3, end: map[int]bool{imEnd: true}}
	var pieces []string
	for _, id := range append(ids, imEnd) {
		c.push(id, -1)
		if s := c.take(); s != "" {
			pieces = append(pieces, s)
		}
	}
	pieces = append(pieces, c.flush())
	for _, p := range pieces {
		if !utf8.ValidString(p) || strings.ContainsRune(p, utf8.RuneError) {
			t.Fatalf("piece %q is not whole characters (pieces %q)", p, pieces)
		}
	}
	if got, want := strings.Join(pieces, ""), text[:strings.Index(text, "STOP")]; got != want {
		t.Fatalf("streamed %q, want %q", got, want)
	}
	if c.finishReason("length") != "stop" {
		t.Fatal("a stop string is finish_reason stop")
	}
	// Without stop strings, the end-of-turn token has no text and every piece goes out at once.
	c = &choiceStream{tok: tok, end: map[int]bool{imEnd: true}}
	var all strings.Builder
	for _, id := range append(tok.Encode("plain text"), imEnd) {
		c.push(id, -1)
		all.WriteString(c.take())
	}
	if all.String() != "plain text" || c.flush() != "" {
		t.Fatalf("plain stream %q", all.String())
	}
}

// Every error is OpenAI's shape with its status, type, param and code.
func TestOpenAIErrorShape(t *testing.T) {
	for _, tc := range []struct {
		err              error
		status           int
		typ, param, code string
	}{
		{badParam("temperature", "too hot"), 400, "invalid_request_error", "temperature", ""},
		{modelNotFound("m"), 404, "invalid_request_error", "model", "model_not_found"},
		{errf(401, "missing key"), 401, "authentication_error", "", "invalid_api_key"},
		{errf(429, "busy"), 429, "rate_limit_error", "", "rate_limit_exceeded"},
		{errf(413, "big"), 413, "invalid_request_error", "", ""},
		{os.ErrClosed, 500, "server_error", "", ""},
	} {
		status, body := openAIErrorOf(tc.err)
		e := body.Error
		if status != tc.status || e.Type != tc.typ || e.Message == "" ||
			(tc.param == "") != (e.Param == nil) || (e.Param != nil && *e.Param != tc.param) ||
			(tc.code == "") != (e.Code == nil) || (e.Code != nil && *e.Code != tc.code) {
			t.Errorf("%v: %d %+v", tc.err, status, e)
		}
	}
}
