package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/engine/tokenizer"
)

// choiceStream turns one choice's tokens into text as they come: a token that ends inside a
// UTF-8 character waits for the next, and text that may begin a stop string is held back until
// it is known not to (a stop string and what follows it are not part of the answer).
type choiceStream struct {
	tok     *tokenizer.Tokenizer
	stops   []string
	hold    int // bytes held back: the longest stop string but one
	end     map[int]bool
	text    []int  // tokens with text (end-of-turn tokens have none)
	decoded int    // tokens of text whose text is in held or out
	held    string // decoded, not yet taken
	stopped bool   // a stop string was reached: nothing more is answered

	tokens   []int     // every token, for logprobs
	logprobs []float64 // their logprobs
	top      [][][2]float64
	reported int // tokens whose logprobs went out
}

// contextTokens is how many tokens before the new ones are decoded with them, so that decoders
// which treat the start of a text specially (SentencePiece's leading space) see it as in the
// whole answer.
const contextTokens = 4

func (j *oaiJob) newChoiceStream() *choiceStream {
	c := &choiceStream{tok: j.eng.Tokenizer, stops: j.sr.Params.StopStrings, end: j.endTokens}
	for _, s := range c.stops {
		c.hold = max(c.hold, len(s)-1)
	}
	return c
}

func (c *choiceStream) push(token int, logprob float64) {
	if c.stopped {
		return
	}
	c.tokens = append(c.tokens, token)
	c.logprobs = append(c.logprobs, logprob)
	if c.end[token] {
		return
	}
	c.text = append(c.text, token)
	start := max(0, c.decoded-contextTokens)
	before := c.tok.Decode(c.text[start:c.decoded])
	all := c.tok.Decode(c.text[start:])
	add, ok := strings.CutPrefix(all, before)
	if !ok {
		add = c.tok.Decode(c.text[c.decoded:])
	}
	if cutCharacter(add) && len(c.text)-c.decoded < utf8.UTFMax {
		return // the rest of the character is in the next token
	}
	c.decoded = len(c.text)
	c.held += add
	if i := firstStop(c.held, c.stops); i >= 0 {
		c.held, c.stopped = c.held[:i], true
	}
}

// take returns the text that can go out now.
func (c *choiceStream) take() string {
	if c.stopped {
		return c.flush()
	}
	cut := len(c.held) - c.hold
	for cut > 0 && cut < len(c.held) && !utf8.RuneStart(c.held[cut]) {
		cut--
	}
	if cut <= 0 {
		return ""
	}
	out := c.held[:cut]
	c.held = c.held[cut:]
	return validText(out)
}

// flush returns all the text left, at the end of the answer.
func (c *choiceStream) flush() string {
	if !c.stopped && c.decoded < len(c.text) {
		c.held += c.tok.Decode(c.text[c.decoded:])
		c.decoded = len(c.text)
		if i := firstStop(c.held, c.stops); i >= 0 {
			c.held, c.stopped = c.held[:i], true
		}
	}
	out := c.held
	c.held = ""
	return validText(out)
}

func (c *choiceStream) finishReason(engineReason string) string {
	if c.stopped || engineReason == "stop" {
		return "stop"
	}
	return "length"
}

// validText replaces every byte that is not part of a UTF-8 character with U+FFFD, byte by byte,
// so that text cut into pieces reads the same as the whole.
func validText(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		if r == utf8.RuneError && n == 1 {
			b.WriteString("\uFFFD")
		} else {
			b.WriteString(s[:n])
		}
		s = s[n:]
	}
	return b.String()
}

// cutCharacter reports whether s ends inside a UTF-8 character.
func cutCharacter(s string) bool {
	for i := len(s) - 1; i >= 0 && i >= len(s)-utf8.UTFMax; i-- {
		if utf8.RuneStart(s[i]) {
			return !utf8.FullRuneInString(s[i:])
		}
	}
	return false
}

func firstStop(text string, stops []string) int {
	first := -1
	for _, s := range stops {
		if i := strings.Index(text, s); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	return first
}

// newLogprobs returns the indices of the tokens whose logprobs have not gone out yet.
func (c *choiceStream) newLogprobs() (int, int) {
	from := c.reported
	c.reported = len(c.tokens)
	return from, len(c.tokens)
}

func (c *choiceStream) tokenText(t int) (string, []int) {
	s := c.tok.Decode([]int{t})
	b := make([]int, len(s))
	for i := range len(s) {
		b[i] = int(s[i])
	}
	return validText(s), b
}

// finite keeps JSON encodable: a missing logprob (NaN) is written as the lowest float.
func finite(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return -math.MaxFloat32
	}
	return v
}

// chatLogprobs are the logprobs of the tokens not reported yet, in the chat shape.
func (c *choiceStream) chatLogprobs(want bool) *api.ChatLogprobs {
	if !want {
		return nil
	}
	from, to := c.newLogprobs()
	out := &api.ChatLogprobs{Content: []api.TokenLogprobInfo{}}
	for k := from; k < to; k++ {
		s, b := c.tokenText(c.tokens[k])
		info := api.TokenLogprobInfo{Token: s, Logprob: finite(c.logprobs[k]), Bytes: b, TopLogprobs: []api.TopLogprob{}}
		if k < len(c.top) {
			for _, alt := range c.top[k] {
				s, b := c.tokenText(int(alt[0]))
				info.TopLogprobs = append(info.TopLogprobs, api.TopLogprob{Token: s, Logprob: finite(alt[1]), Bytes: b})
			}
		}
		out.Content = append(out.Content, info)
	}
	return out
}

// completionLogprobs are the same in the legacy completions shape.
func (c *choiceStream) completionLogprobs(want bool) *api.CompletionLogprobs {
	if !want {
		return nil
	}
	from, to := c.newLogprobs()
	out := &api.CompletionLogprobs{Tokens: []string{}, TokenLogprobs: []float64{}, TextOffset: []int{}}
	offset := 0
	for k := from; k < to; k++ {
		s, _ := c.tokenText(c.tokens[k])
		out.Tokens = append(out.Tokens, s)
		out.TokenLogprobs = append(out.TokenLogprobs, finite(c.logprobs[k]))
		out.TextOffset = append(out.TextOffset, offset)
		offset += len(s)
		if len(c.top) > 0 {
			m := map[string]float64{}
			if k < len(c.top) {
				for _, alt := range c.top[k] {
					s, _ := c.tokenText(int(alt[0]))
					m[s] = finite(alt[1])
				}
			}
			out.TopLogprobs = append(out.TopLogprobs, m)
		}
	}
	return out
}

// tokenFeed carries tokens from the decode loop (OnToken) to the handler writing the stream. The
// decode loop never waits on it: tokens are appended, and the writer woken if it sleeps.
type tokenFeed struct {
	ctx  context.Context
	mu   sync.Mutex
	toks []fedToken
	wake chan struct{}
}

type fedToken struct {
	sample, token int
	logprob       float64
}

func (f *tokenFeed) onToken(sample, token int, logprob float64) bool {
	if f.ctx.Err() != nil {
		return false // the client went away: stop this decode
	}
	f.mu.Lock()
	f.toks = append(f.toks, fedToken{sample, token, logprob})
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
	return true
}

func (f *tokenFeed) take() []fedToken {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.toks
	f.toks = nil
	return t
}

// sseWriter writes Server-Sent Events, each flushed at once; its first error stays.
type sseWriter struct {
	o   *openAI
	w   http.ResponseWriter
	err error
}

func (e *sseWriter) send(v any) {
	if e.err != nil {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		e.err = err
		return
	}
	e.o.srv.writeWithin(e.w, e.o.writeTimeout)
	if _, e.err = fmt.Fprintf(e.w, "data: %s\n\n", b); e.err == nil {
		e.err = http.NewResponseController(e.w).Flush()
	}
}

func (e *sseWriter) done() {
	if e.err == nil {
		_, e.err = fmt.Fprint(e.w, "data: [DONE]\n\n")
		if e.err == nil {
			e.err = http.NewResponseController(e.w).Flush()
		}
	}
}

// streamOAIJob answers with Server-Sent Events in OpenAI's chunk format, token by token as the
// decoder draws them, and stops the decode when the client goes or stops reading.
func (o *openAI) streamOAIJob(w http.ResponseWriter, r *http.Request, j *oaiJob) error {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	feed := &tokenFeed{ctx: ctx, wake: make(chan struct{}, 1)}
	j.sr.OnToken = feed.onToken
	f, err := o.srv.startSample(r.Context(), w, r, j.tenant, j.smp, j.sr)
	if err != nil {
		return err // nothing is written yet: a plain error answer
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	st := newOAIStream(j, &sseWriter{o: o, w: w})
	for running := true; running; {
		select {
		case <-feed.wake:
			st.forward(feed.take())
		case <-f.done:
			running = false
		case <-ctx.Done():
			return nil // the client went: OnToken ends the decode at its next token
		}
		if st.out.err != nil {
			cancel() // the client stopped reading
			o.log.Debug("openai stream ended by the client", "err", st.out.err)
			return nil
		}
	}
	st.forward(feed.take())
	res, err := awaitSample(ctx, f)
	if err != nil {
		_, body := openAIErrorOf(err)
		st.out.send(body)
		st.out.done()
		return nil
	}
	st.finish(res)
	return nil
}

// oaiStream is one streamed answer's choices: the text each has decoded and how many of its
// tokens have been pushed, and the writer their chunks go to.
type oaiStream struct {
	j       *oaiJob
	out     *sseWriter
	choices []*choiceStream
	pushed  []int
}

// newOAIStream opens every choice (a chat answer's first chunk names the assistant's role).
func newOAIStream(j *oaiJob, out *sseWriter) *oaiStream {
	n := j.sr.NumSamples
	st := &oaiStream{j: j, out: out, choices: make([]*choiceStream, n), pushed: make([]int, n)}
	for i := range st.choices {
		st.choices[i] = j.newChoiceStream()
		if j.chat {
			empty := ""
			out.send(j.chatChunk(api.ChatChoice{Index: i, Delta: &api.ChatChoiceMessage{Role: "assistant", Content: &empty}}))
		}
	}
	return st
}

// emit sends choice i's new text (and its finish reason, at the end) as one chunk.
func (st *oaiStream) emit(i int, text string, finish *string) {
	c, j := st.choices[i], st.j
	if j.chat {
		d := &api.ChatChoiceMessage{}
		if text != "" {
			d.Content = &text
		}
		st.out.send(j.chatChunk(api.ChatChoice{Index: i, Delta: d, Logprobs: c.chatLogprobs(j.logprobs), FinishReason: finish}))
		return
	}
	st.out.send(j.completionChunk(api.CompletionChoice{Index: i, Text: text, Logprobs: c.completionLogprobs(j.logprobs), FinishReason: finish}))
}

// forward pushes tokens the decoder drew into their choices and sends what text they complete.
func (st *oaiStream) forward(toks []fedToken) {
	n := len(st.choices)
	for _, t := range toks {
		if t.sample < 0 || t.sample >= n {
			continue
		}
		st.choices[t.sample].push(t.token, t.logprob)
		st.pushed[t.sample]++
	}
	for i, c := range st.choices {
		if text := c.take(); text != "" {
			st.emit(i, text, nil)
		}
	}
}

// finish sends each choice's remaining text and finish reason, then the usage chunk if asked.
func (st *oaiStream) finish(res *api.SampleResponse) {
	j, n := st.j, len(st.choices)
	usage := &api.Usage{PromptTokens: len(j.sr.Prompt)}
	for i, q := range res.Sequences {
		if i >= n {
			break
		}
		usage.CompletionTokens += len(q.Tokens)
		// A remote worker's decode does not call OnToken: its tokens come with the answer.
		for k := st.pushed[i]; k < len(q.Tokens); k++ {
			st.choices[i].push(q.Tokens[k], logprobAt(q.Logprobs, k))
		}
		if text := st.choices[i].take() + st.choices[i].flush(); text != "" {
			st.emit(i, text, nil)
		}
		finish := st.choices[i].finishReason(q.StopReason)
		st.emit(i, "", &finish) // as OpenAI ends a choice: an empty delta with its finish_reason
	}
	usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
	if j.includeUsage {
		if j.chat {
			c := j.chatChunk()
			c.Usage = usage
			st.out.send(c)
		} else {
			c := j.completionChunk()
			c.Usage = usage
			st.out.send(c)
		}
	}
	st.out.done()
}

func (j *oaiJob) chatChunk(choices ...api.ChatChoice) api.ChatCompletion {
	return api.ChatCompletion{ID: "chatcmpl-" + j.id, Object: "chat.completion.chunk", Created: j.created, Model: j.model,
		Choices: append([]api.ChatChoice{}, choices...)}
}

func (j *oaiJob) completionChunk(choices ...api.CompletionChoice) api.Completion {
	return api.Completion{ID: "cmpl-" + j.id, Object: "text_completion", Created: j.created, Model: j.model,
		Choices: append([]api.CompletionChoice{}, choices...)}
}
