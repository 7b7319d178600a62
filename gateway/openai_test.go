package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/client"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/gateway"
)

// oai sends an OpenAI API request with a bearer key, as OpenAI's SDKs do.
func oai(t *testing.T, method, url, key, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func oaiOK[T any](t *testing.T, url, key, path, body string) T {
	t.Helper()
	status, b := oai(t, "POST", url, key, path, body)
	if status != http.StatusOK {
		t.Fatalf("%s: %d %s", path, status, b)
	}
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v in %s", path, err, b)
	}
	return v
}

// chatPrompt is the tiny model's template rendered for one user message.
func chatPrompt(user string) string {
	return "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n"
}

// A chat completion renders the model's template, samples as the Tinker API does for the same
// tokens (greedy: the same answer), and counts its tokens.
func TestOpenAIChatMatchesTinkerSampling(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	models := struct {
		Object string
		Data   []api.OpenAIModel
	}{}
	status, b := oai(t, "GET", ts.URL, "tml-a", "/v1/models", "")
	if err := json.Unmarshal(b, &models); status != 200 || err != nil || models.Object != "list" || len(models.Data) != 1 || models.Data[0].ID != base {
		t.Fatalf("models: %d %s", status, b)
	}
	c := oaiOK[api.ChatCompletion](t, ts.URL, "tml-a", "/v1/chat/completions",
		`{"model":"`+base+`","messages":[{"role":"user","content":"hello there"}],"temperature":0,"max_tokens":6,"logprobs":true,"top_logprobs":3}`)
	prompt := ts.eng.Tokenizer.Encode(chatPrompt("hello there"))
	tinker, err := ts.eng.Sample("", engine.SampleRequest{Prompt: prompt, Params: engine.SampleParams{MaxTokens: 6}})
	if err != nil {
		t.Fatal(err)
	}
	q := tinker.Sequences[0]
	if c.Object != "chat.completion" || len(c.Choices) != 1 || c.Choices[0].Message == nil || c.Choices[0].Message.Content == nil {
		t.Fatalf("answer %+v", c)
	}
	answer := q.Tokens
	if q.StopReason == "stop" { // the end-of-turn token has no text
		answer = answer[:len(answer)-1]
	}
	want := ts.eng.Tokenizer.Decode(answer)
	if *c.Choices[0].Message.Content != want && utf8.ValidString(want) || !utf8.ValidString(*c.Choices[0].Message.Content) {
		t.Fatalf("content %q, Tinker's greedy sample %q", *c.Choices[0].Message.Content, want)
	}
	if c.Usage == nil || c.Usage.PromptTokens != len(prompt) || c.Usage.CompletionTokens != len(q.Tokens) ||
		c.Usage.TotalTokens != len(prompt)+len(q.Tokens) {
		t.Fatalf("usage %+v, want prompt %d completion %d", c.Usage, len(prompt), len(q.Tokens))
	}
	if fr := c.Choices[0].FinishReason; fr == nil || *fr != map[string]string{"length": "length", "stop": "stop"}[q.StopReason] {
		t.Fatalf("finish_reason %v for %s", fr, q.StopReason)
	}
	lp := c.Choices[0].Logprobs
	if lp == nil || len(lp.Content) == 0 || len(lp.Content[0].TopLogprobs) != 3 {
		t.Fatalf("logprobs %+v", lp)
	}
	for i, tok := range lp.Content {
		// Greedy: the drawn token is the most likely one, and its logprob is the top one's.
		if top := tok.TopLogprobs[0]; top.Token != tok.Token || top.Logprob-tok.Logprob > 1e-3 || tok.Logprob-q.Logprobs[i] > 1e-3 || q.Logprobs[i]-tok.Logprob > 1e-3 {
			t.Fatalf("token %d: %+v, sampled logprob %v", i, tok, q.Logprobs[i])
		}
	}

	// Legacy completions over the same prompt text, with n samples and a seed: reproducible.
	body := `{"model":"` + base + `","prompt":"The quick brown fox","max_tokens":5,"n":3,"seed":7,"temperature":1}`
	a := oaiOK[api.Completion](t, ts.URL, "tml-a", "/v1/completions", body)
	b2 := oaiOK[api.Completion](t, ts.URL, "tml-a", "/v1/completions", body)
	if len(a.Choices) != 3 || a.Object != "text_completion" {
		t.Fatalf("completions %+v", a)
	}
	for i := range a.Choices {
		if a.Choices[i].Text != b2.Choices[i].Text || a.Choices[i].Index != i {
			t.Fatalf("seeded sample %d: %q then %q", i, a.Choices[i].Text, b2.Choices[i].Text)
		}
	}
}

// Bad requests are OpenAI errors with the status, param and code a client checks.
func TestOpenAIErrors(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	chat := func(fields string) string {
		return `{"model":"` + base + `","messages":[{"role":"user","content":"hi"}]` + fields + `}`
	}
	for _, tc := range []struct {
		name, key, path, body string
		status                int
		param, code           string
	}{
		{"no key", "", "/v1/chat/completions", chat(""), 401, "", "invalid_api_key"},
		{"unknown model", "tml-a", "/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`, 404, "model", "model_not_found"},
		{"unknown checkpoint", "tml-a", "/v1/completions", `{"model":"tinker://nope:train:0/sampler_weights/x","prompt":"hi"}`, 404, "model", "model_not_found"},
		{"hot", "tml-a", "/v1/chat/completions", chat(`,"temperature":2.5`), 400, "temperature", ""},
		{"top_p", "tml-a", "/v1/chat/completions", chat(`,"top_p":1.5`), 400, "top_p", ""},
		{"n", "tml-a", "/v1/chat/completions", chat(`,"n":0`), 400, "n", ""},
		{"max_tokens", "tml-a", "/v1/chat/completions", chat(`,"max_tokens":0`), 400, "max_tokens", ""},
		{"top_logprobs alone", "tml-a", "/v1/chat/completions", chat(`,"top_logprobs":2`), 400, "top_logprobs", ""},
		{"top_logprobs", "tml-a", "/v1/chat/completions", chat(`,"logprobs":true,"top_logprobs":21`), 400, "top_logprobs", ""},
		{"stop", "tml-a", "/v1/chat/completions", chat(`,"stop":[""]`), 400, "stop", ""},
		{"stop type", "tml-a", "/v1/chat/completions", chat(`,"stop":5`), 400, "stop", ""},
		{"penalty", "tml-a", "/v1/chat/completions", chat(`,"presence_penalty":1`), 400, "presence_penalty", ""},
		{"tools", "tml-a", "/v1/chat/completions", chat(`,"tools":[{"type":"function"}]`), 400, "tools", ""},
		{"role", "tml-a", "/v1/chat/completions", `{"model":"` + base + `","messages":[{"role":"tool","content":"x"}]}`, 400, "messages[0].role", ""},
		{"no messages", "tml-a", "/v1/chat/completions", `{"model":"` + base + `","messages":[]}`, 400, "messages", ""},
		{"image", "tml-a", "/v1/chat/completions", `{"model":"` + base + `","messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, 400, "messages[0].content", ""},
		{"prompt list", "tml-a", "/v1/completions", `{"model":"` + base + `","prompt":["a","b"]}`, 400, "prompt", ""},
		{"vocabulary", "tml-a", "/v1/completions", `{"model":"` + base + `","prompt":[99999]}`, 400, "", ""},
		{"too long", "tml-a", "/v1/completions", `{"model":"` + base + `","prompt":[` + strings.Repeat("1,", 1100) + `1]}`, 400, "", ""},
		{"wrong type", "tml-a", "/v1/completions", `{"model":"` + base + `","prompt":"hi","max_tokens":"many"}`, 400, "", ""},
		{"stream top logprobs", "tml-a", "/v1/completions", `{"model":"` + base + `","prompt":"hi","stream":true,"logprobs":2}`, 400, "stream", ""},
	} {
		status, b := oai(t, "POST", ts.URL, tc.key, tc.path, tc.body)
		var e api.OpenAIError
		if err := json.Unmarshal(b, &e); err != nil || status != tc.status || e.Error.Message == "" || e.Error.Type == "" {
			t.Errorf("%s: %d %s", tc.name, status, b)
			continue
		}
		if (tc.param != "") != (e.Error.Param != nil) || e.Error.Param != nil && *e.Error.Param != tc.param {
			t.Errorf("%s: param %v, want %q (%s)", tc.name, e.Error.Param, tc.param, b)
		}
		if tc.code != "" && (e.Error.Code == nil || *e.Error.Code != tc.code) {
			t.Errorf("%s: code %v, want %q", tc.name, e.Error.Code, tc.code)
		}
	}
	// A full sampling queue is 429 with Retry-After, which OpenAI's SDKs back off on.
	busy := newServer(t, gateway.Options{MaxQueuedSamples: -1})
	status, b := oai(t, "POST", busy.URL, "tml-a", "/v1/chat/completions", chat(""))
	var e api.OpenAIError
	if json.Unmarshal(b, &e); status != 429 || e.Error.Type != "rate_limit_error" {
		t.Fatalf("busy: %d %s", status, b)
	}
}

// sseEvents reads a stream's events: the JSON of each "data:" line, up to [DONE].
func sseEvents(t *testing.T, body io.Reader) ([]json.RawMessage, bool) {
	t.Helper()
	var events []json.RawMessage
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	blank := true
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			blank = true
			continue
		}
		if !blank || !strings.HasPrefix(line, "data: ") {
			t.Fatalf("not an SSE event line (after a blank line): %q", line)
		}
		blank = false
		data := strings.TrimPrefix(line, "data: ")
		if data == "[DONE]" {
			return events, true
		}
		events = append(events, json.RawMessage(data))
	}
	return events, false
}

// A streamed chat answer is Server-Sent Events in OpenAI's chunk format: the role first, then
// the content piece by piece, a finish_reason, the usage when asked, and [DONE]; its pieces add
// up to the answer the same request gets unstreamed.
func TestOpenAIStreamFraming(t *testing.T) {
	ts := newServer(t, gateway.Options{})
	req := `{"model":"` + base + `","messages":[{"role":"user","content":"Tell me a story"}],"temperature":0,"max_tokens":12,"logprobs":true`
	whole := oaiOK[api.ChatCompletion](t, ts.URL, "tml-a", "/v1/chat/completions", req+`}`)
	hr, _ := http.NewRequest("POST", ts.URL+"/v1/chat/completions", strings.NewReader(req+`,"stream":true,"stream_options":{"include_usage":true}}`))
	hr.Header.Set("Authorization", "Bearer tml-a")
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream answer %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	events, done := sseEvents(t, resp.Body)
	if !done || len(events) < 3 {
		t.Fatalf("%d events, [DONE] %v", len(events), done)
	}
	var text strings.Builder
	var finish string
	var usage *api.Usage
	tokens := 0
	for i, raw := range events {
		var c api.ChatCompletion
		if err := json.Unmarshal(raw, &c); err != nil || c.Object != "chat.completion.chunk" || c.ID != events0ID(t, events) {
			t.Fatalf("event %d: %s", i, raw)
		}
		if c.Usage != nil {
			if len(c.Choices) != 0 || i != len(events)-1 {
				t.Fatalf("usage chunk %d of %d: %s", i, len(events), raw)
			}
			usage = c.Usage
			continue
		}
		if len(c.Choices) != 1 || c.Choices[0].Delta == nil {
			t.Fatalf("event %d: %s", i, raw)
		}
		ch := c.Choices[0]
		if i == 0 && ch.Delta.Role != "assistant" {
			t.Fatalf("first chunk %s", raw)
		}
		if ch.Delta.Content != nil {
			text.WriteString(*ch.Delta.Content)
		}
		if ch.Logprobs != nil {
			tokens += len(ch.Logprobs.Content)
		}
		if ch.FinishReason != nil {
			finish = *ch.FinishReason
		}
	}
	w := whole.Choices[0]
	if text.String() != *w.Message.Content || finish != *w.FinishReason {
		t.Fatalf("streamed %q (%s), unstreamed %q (%s)", text.String(), finish, *w.Message.Content, *w.FinishReason)
	}
	if usage == nil || *usage != *whole.Usage || tokens != len(w.Logprobs.Content) {
		t.Fatalf("usage %+v / %+v, %d token logprobs of %d", usage, whole.Usage, tokens, len(w.Logprobs.Content))
	}
}

func events0ID(t *testing.T, events []json.RawMessage) string {
	var c api.ChatCompletion
	if err := json.Unmarshal(events[0], &c); err != nil || c.ID == "" {
		t.Fatalf("first event %s", events[0])
	}
	return c.ID
}

// watchedEngine is the tiny engine with its sampling watched: after a stream's first tokens it
// waits for the test's client to hang up, and records where the gateway's OnToken asked to stop.
type watchedEngine struct {
	*engine.Engine
	clientGone chan struct{}
	mu         sync.Mutex
	refusedAt  int // tokens handed over when OnToken first answered false; 0 if never
	lengths    []int
}

func (w *watchedEngine) LocalEngine() *engine.Engine { return w.Engine }

func (w *watchedEngine) SampleBatch(ctx context.Context, id string, reqs []engine.SampleRequest) ([]*engine.SampleResult, error) {
	n := 0 // tokens handed over (one streamed request)
	for i := range reqs {
		w.watch(&reqs[i], &n)
	}
	res, err := w.Engine.SampleBatch(ctx, id, reqs)
	for _, r := range res {
		if r != nil && len(r.Sequences) > 0 {
			w.ended(r, nil, n)
		}
	}
	if err != nil {
		w.ended(nil, err, n)
	}
	return res, err
}

// SampleContinuous watches the requests of a continuous loop (the in-process replica's way to
// sample) as SampleBatch does a batch's.
func (w *watchedEngine) SampleContinuous(ctx context.Context, first []engine.FedRequest, feed func(int) []engine.FedRequest) error {
	n := 0
	watched := func(fs []engine.FedRequest) []engine.FedRequest {
		for i := range fs {
			w.watch(&fs[i].Req, &n)
			done := fs[i].Done
			fs[i].Done = func(res *engine.SampleResult, err error) {
				w.ended(res, err, n)
				done(res, err)
			}
		}
		return fs
	}
	return w.Engine.SampleContinuous(ctx, watched(first), func(rows int) []engine.FedRequest { return watched(feed(rows)) })
}

// watch wraps a streamed request's OnToken: after its third token it waits for the test's
// client to hang up, and records where OnToken first refused (n counts the tokens handed over).
func (w *watchedEngine) watch(r *engine.SampleRequest, n *int) {
	inner := r.OnToken
	if inner == nil {
		return
	}
	r.OnToken = func(sample, token int, lp float64) bool {
		*n++
		if *n == 3 {
			<-w.clientGone
			// The server notices a closed connection on its own time: give it a bounded while.
			for range 2000 {
				if !inner(sample, token, lp) {
					w.mu.Lock()
					w.refusedAt = *n
					w.mu.Unlock()
					return false
				}
				time.Sleep(time.Millisecond)
			}
		}
		if !inner(sample, token, lp) {
			w.mu.Lock()
			w.refusedAt = *n
			w.mu.Unlock()
			return false
		}
		return true
	}
}

// ended records how long a decode ran: its first sample's tokens, or, when it stopped with its
// client's context, the n tokens handed over by then (it stopped without waiting for OnToken to
// refuse).
func (w *watchedEngine) ended(res *engine.SampleResult, err error, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if errors.Is(err, context.Canceled) {
		if w.refusedAt == 0 {
			w.refusedAt = n
		}
		w.lengths = append(w.lengths, n)
	}
	if res != nil && len(res.Sequences) > 0 {
		w.lengths = append(w.lengths, len(res.Sequences[0].Tokens))
	}
}

// A client that hangs up on a stream stops its decode: the engine's loop ends at the token where
// the gateway notices, not at max_tokens.
func TestOpenAIStreamDisconnectStopsDecode(t *testing.T) {
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w := &watchedEngine{Engine: e, clientGone: make(chan struct{})}
	url := serverOver(t, w, gateway.Options{}).URL
	ctx, cancel := context.WithCancel(context.Background())
	hr, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", strings.NewReader(
		`{"model":"`+base+`","prompt":"The quick brown fox","max_tokens":400,"seed":3,"stream":true}`))
	hr.Header.Set("Authorization", "Bearer tml-a")
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first event %q: %v", line, err)
	}
	cancel()
	resp.Body.Close()
	close(w.clientGone)
	deadline := time.After(30 * time.Second)
	for {
		w.mu.Lock()
		refused, lengths := w.refusedAt, append([]int(nil), w.lengths...)
		w.mu.Unlock()
		if len(lengths) > 0 {
			if refused == 0 || lengths[0] != refused || refused >= 400 {
				t.Fatalf("decode ran %d tokens; OnToken refused at %d", lengths[0], refused)
			}
			return
		}
		select {
		case <-deadline:
			t.Fatal("the decode did not end")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// gatedEngine holds its first SampleBatch until released, and records every batch's requests.
type gatedEngine struct {
	*engine.Engine
	entered, release chan struct{}
	mu               sync.Mutex
	batches          [][]engine.SampleRequest
}

func (g *gatedEngine) LocalEngine() *engine.Engine { return g.Engine }

func (g *gatedEngine) SampleBatch(ctx context.Context, id string, reqs []engine.SampleRequest) ([]*engine.SampleResult, error) {
	g.mu.Lock()
	first := len(g.batches) == 0
	g.batches = append(g.batches, append([]engine.SampleRequest(nil), reqs...))
	g.mu.Unlock()
	if first {
		close(g.entered)
		<-g.release
	}
	return g.Engine.SampleBatch(ctx, id, reqs)
}

// SampleContinuous gates and records a continuous loop (the in-process replica's way to sample)
// as SampleBatch does a batch: its first requests are a batch, and so is each group its feed
// hands it (requests that join the loop together).
func (g *gatedEngine) SampleContinuous(ctx context.Context, first []engine.FedRequest, feed func(int) []engine.FedRequest) error {
	record := func(fs []engine.FedRequest) bool {
		reqs := make([]engine.SampleRequest, len(fs))
		for i, f := range fs {
			reqs[i] = f.Req
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		if len(fs) > 0 {
			g.batches = append(g.batches, reqs)
		}
		return len(g.batches) == 1
	}
	if record(first) {
		close(g.entered)
		<-g.release
	}
	return g.Engine.SampleContinuous(ctx, first, func(rows int) []engine.FedRequest {
		fs := feed(rows)
		record(fs)
		return fs
	})
}

// An OpenAI request waits in the same per-replica queue as Tinker's asample and is decoded in
// the same batch with it.
func TestOpenAIBatchesWithTinkerSampling(t *testing.T) {
	e, err := engine.Load(modelDir(), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedEngine{Engine: e, entered: make(chan struct{}), release: make(chan struct{})}
	url := serverOver(t, g, gateway.Options{}).URL
	first := submitSample(t, url, "tml-a", nil, tinySample)
	<-g.entered // the replica is busy with the first sample
	second := submitSample(t, url, "tml-a", nil, tinySample)
	answered := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("POST", url+"/v1/completions", strings.NewReader(`{"model":"`+base+`","prompt":"The quick","max_tokens":2}`))
		req.Header.Set("Authorization", "Bearer tml-a")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	c := client.New(url, "tml-a")
	for tries := 0; ; tries++ {
		if tries == 6000 {
			t.Fatal("the OpenAI request never joined the sampling queue")
		}
		var view struct {
			Replicas []struct{ Queue map[string]int }
		}
		if err := c.Do(context.Background(), "GET", "skein/replicas", nil, &view); err != nil || len(view.Replicas) != 1 {
			t.Fatalf("replicas: %v %+v", err, view)
		}
		if view.Replicas[0].Queue["sampling_batched"] == 2 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(g.release)
	awaitSample(t, url, "tml-a", first)
	awaitSample(t, url, "tml-a", second)
	if status := <-answered; status != http.StatusOK {
		t.Fatalf("completion: %d", status)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.batches) != 2 || len(g.batches[1]) != 2 || (g.batches[1][0].OnToken == nil) == (g.batches[1][1].OnToken == nil) {
		t.Fatalf("batches %d; the second holds %d requests (want the Tinker and the OpenAI one)", len(g.batches), len(g.batches[len(g.batches)-1]))
	}
}
