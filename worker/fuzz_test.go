package worker

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/skein-ai/skein/engine"
)

// fuzzData and fuzzSamples are the calls whose answers FuzzAnswer decodes.
var (
	fuzzData    = []engine.Datum{{Tokens: []int{1, 2, 3}}, {Tokens: []int{4}}}
	fuzzSamples = []engine.SampleRequest{{Prompt: []int{1, 2}, NumSamples: 2, PromptLogprobs: true, TopKPromptLogprobs: 2, Params: engine.SampleParams{MaxTokens: 3}}}
)

// What the gateway decodes from a worker's answers: any bytes give a result that matches the
// call or an error, never a panic.
func FuzzAnswer(f *testing.F) {
	for _, seed := range []string{
		`{}`, `{"error":"x","kind":"input","datum":-5}`, `{"forward":null}`,
		`{"forward":{"Logprobs":[[0,0,0],[0]],"Losses":[[0,0,0],[0]],"Loss":1}}`,
		`{"samples":[{"sequences":[{"Tokens":[1],"Logprobs":[-1],"StopReason":"length"},{"Tokens":[],"Logprobs":[],"StopReason":"stop"}],"prompt_logprobs":[null,-1],"topk_prompt":[null,[{"Token":3,"Logprob":-1}]]}]}`,
		`{"lora":{"rank":2},"step":3}`, `{"metrics":{"a":1}}`, `{"ids":["a",""]}`, `[`, `{"samples":[null]}`,
	} {
		f.Add([]byte(seed))
	}
	info := (&fakeEngine{}).Info()
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := decodeAnswer(bytes.NewReader(body), 1<<20)
		if err != nil {
			return
		}
		_ = decodeErr(r)
		if checkForward(r.Forward, fuzzData) == nil {
			for i, d := range fuzzData {
				if len(r.Forward.Logprobs[i]) != len(d.Tokens) {
					t.Fatalf("accepted %d logprobs for %d tokens", len(r.Forward.Logprobs[i]), len(d.Tokens))
				}
			}
		}
		if checkSamples(r.Samples, fuzzSamples, info) == nil {
			res := fromWireSample(r.Samples[0])
			if len(res.Sequences) != 2 || len(res.PromptLogprobs) != 2 {
				t.Fatalf("accepted %+v", res)
			}
			for _, s := range res.Sequences {
				for _, tok := range s.Tokens {
					if tok < 0 || tok >= info.Config.VocabSize {
						t.Fatalf("accepted token %d", tok)
					}
				}
			}
		}
		if checkLora(r.Lora, r.Step, info) == nil && (r.Lora.Rank < 1 || r.Lora.Rank > info.MaxRank || r.Step < 0) {
			t.Fatalf("accepted %+v step %d", r.Lora, r.Step)
		}
		_ = checkMetrics(r.Metrics)
		_ = checkIDs(r.IDs)
	})
}

// What a worker decodes from the gateway's calls: any body, to any method, is answered with a
// JSON message (an error or a result), never a panic; loads and saves never leave the data dir.
func FuzzCall(f *testing.F) {
	for _, seed := range []struct{ method, body string }{
		{"create", `{"id":"a","lora":{"rank":2}}`}, {"create", `{"id":"a"}`}, {"optim_step", `{"id":"a"}`},
		{"load", `{"id":"a","dir":"../../etc"}`}, {"save", `{"id":"a","dir":"/tmp/x"}`},
		{"forward", `{"id":"a","data":[{"Tokens":[1,2]}],"loss":"cross_entropy"}`},
		{"sample", `{"samples":[{"Prompt":[1],"NumSamples":3}]}`}, {"nope", `{}`}, {"info", `[`},
	} {
		f.Add(seed.method, []byte(seed.body))
	}
	dataDir := f.TempDir()
	fe := &fakeEngine{}
	srv := NewServer(fe, "tok", dataDir)
	sess := &signer{sid: NewNonce(), key: []byte("fuzz session key")}
	srv.sessions.add(sess.sid, sess.key, "fuzz-gateway")
	f.Fuzz(func(t *testing.T, method string, body []byte) {
		req := httptest.NewRequest(http.MethodPost, "/worker/v1/x", bytes.NewReader(body))
		req.URL.Path = "/worker/v1/" + method
		sess.sign(req.Header, req.Method, req.URL.Path, body) // a session the gateway proved
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		var r callResponse
		if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil {
			t.Fatalf("answer to %q %q is not JSON: %q", method, body, rec.Body.String())
		}
		for _, dir := range append(fe.loads, fe.saves...) {
			if _, err := inside(dataDir, dir); err != nil {
				t.Fatalf("the engine was handed %q", dir)
			}
		}
		fe.loads, fe.saves = fe.loads[:0], fe.saves[:0]
	})
}

// What the gateway decodes from a worker's registration and heartbeats: a registration that
// passes Validate has an http(s) URL and a model description within bounds.
func FuzzRegistration(f *testing.F) {
	f.Add([]byte(`{"id":"w","url":"http://127.0.0.1:1","base_model":"m","max_loras":4,"info":{"config":{"vocab_size":50,"max_position_embeddings":64},"max_rank":8}}`))
	f.Add([]byte(`{"id":"w","url":"file:///etc","base_model":"m","info":{"config":null}}`))
	f.Add([]byte(`{"id":"w","adapters":["a"],"free_slots":-1,"queue_depth":2}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var reg Registration
		if json.Unmarshal(body, &reg) == nil && reg.Validate() == nil {
			c := reg.Info.Config
			if c == nil || c.VocabSize < 1 || c.VocabSize > maxVocab || reg.MaxLoras < 0 || reg.MaxLoras > maxWorkerLoras ||
				!(strings.HasPrefix(strings.ToLower(reg.URL), "http://") || strings.HasPrefix(strings.ToLower(reg.URL), "https://")) {
				t.Fatalf("accepted %+v", reg)
			}
		}
		var hb Heartbeat
		if json.Unmarshal(body, &hb) == nil && hb.Validate() == nil && (hb.QueueDepth < 0 || len(hb.Adapters) > maxAdapterIDs) {
			t.Fatalf("accepted %+v", hb)
		}
	})
}
