package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/skein-ai/skein/api"
	"github.com/skein-ai/skein/checkpoint"
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/engine/tokenizer"
	"github.com/skein-ai/skein/replica"
)

// The OpenAI-compatible API: GET /v1/models, POST /v1/chat/completions, POST /v1/completions,
// on the same address and keys as the Tinker API (OpenAI's SDKs send Authorization: Bearer).
// A request names a base model, a checkpoint path the caller may read, or the short alias
// /v1/models lists for each of the caller's sampler checkpoints; it samples through the same
// per-replica queue as asample, so it batches with Tinker sampling requests.

// openAIBackend is what the OpenAI endpoints need of the rest of the gateway: the base models
// and checkpoints a tenant may name, samplers over them and sampling, a base model's tokenizer
// files, and the body and write deadlines every handler keeps.
type openAIBackend interface {
	baseModels() []string
	checkpointsWhere(keep func(*ckptMeta) bool, others ...*ckptMeta) []*ckptMeta
	checkpointFor(ctx context.Context, tenant, path string) (*ckptMeta, error)
	replicasOf(base string) ([]*replica.Replica, error)
	newSampler(ctx context.Context, tenant, sessionID, base, modelPath, key string) (*sampler, error)
	currentWeights(ctx context.Context, tenant string, smp *sampler) (*sampler, error)
	filesOf(base string) (baseFiles, replica.LocalModel, error)
	storedTokenizer(ctx context.Context, f baseFiles) (*tokenizer.Tokenizer, error)
	startSample(ctx context.Context, w http.ResponseWriter, r *http.Request, tenant string, smp *sampler, sr engine.SampleRequest) (*future, error)
	readBodyWithin(r *http.Request, limit int64) ([]byte, error)
	writeWithin(w http.ResponseWriter, d time.Duration)
}

// openAI serves the OpenAI-compatible endpoints: a resource of its own (issue 38 item 6). Besides
// openAIBackend it needs the mux it registers on, the keyring, the request metrics, a log and
// two deadlines.
type openAI struct {
	srv             openAIBackend
	mux             *http.ServeMux
	auth            *keyring
	metrics         *metrics
	log             *slog.Logger
	writeTimeout    time.Duration // each answer's (and each streamed event's) write deadline
	templateTimeout time.Duration // a chat template's rendering
}

func (o *openAI) routes() {
	o.openAIHandle("GET /v1/models", o.listOpenAIModels)
	o.openAIHandle("POST /v1/chat/completions", o.chatCompletions)
	o.openAIHandle("POST /v1/completions", o.completions)
}

// oaiError is a failure in OpenAI's terms: the status, error type, the request field at fault
// and a machine-readable code.
type oaiError struct {
	status           int
	typ, param, code string
	msg              string
}

func (e *oaiError) Error() string { return e.msg }

func badParam(param, msg string) error {
	return &oaiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: param, msg: msg}
}

func modelNotFound(name string) error {
	return &oaiError{status: http.StatusNotFound, typ: "invalid_request_error", param: "model", code: "model_not_found",
		msg: "The model `" + name + "` does not exist or you do not have access to it."}
}

// openAIErrorOf turns any error into OpenAI's error body and its status.
func openAIErrorOf(err error) (int, api.OpenAIError) {
	var oe *oaiError
	if !errors.As(err, &oe) {
		oe = &oaiError{status: http.StatusInternalServerError, msg: err.Error()}
		var he *httpError
		if errors.As(err, &he) {
			oe.status, oe.msg = he.status, he.msg
		}
	}
	if oe.typ == "" {
		switch {
		case oe.status == http.StatusUnauthorized:
			oe.typ, oe.code = "authentication_error", "invalid_api_key"
		case oe.status == http.StatusForbidden:
			oe.typ = "permission_error"
		case oe.status == http.StatusNotFound:
			oe.typ = "not_found_error"
		case oe.status == http.StatusTooManyRequests:
			oe.typ, oe.code = "rate_limit_error", "rate_limit_exceeded"
		case oe.status >= 500:
			oe.typ = "server_error"
		default:
			oe.typ = "invalid_request_error"
		}
	}
	body := api.OpenAIError{Error: api.OpenAIErrorBody{Message: oe.msg, Type: oe.typ}}
	if oe.param != "" {
		body.Error.Param = &oe.param
	}
	if oe.code != "" {
		body.Error.Code = &oe.code
	}
	return oe.status, body
}

func writeOpenAIError(w http.ResponseWriter, err error) {
	status, body := openAIErrorOf(err)
	writeJSON(w, status, body)
}

// openAIHandle is handle with OpenAI's error shape; fn writes a stream itself and returns nil.
func (o *openAI) openAIHandle(pattern string, fn handlerFunc) {
	endpoint := pattern[strings.Index(pattern, " ")+1:]
	o.mux.HandleFunc(pattern, func(rw http.ResponseWriter, r *http.Request) {
		w := &statusRecorder{ResponseWriter: rw, status: http.StatusOK}
		o.srv.writeWithin(w, o.writeTimeout)
		defer func() { o.metrics.request(endpoint, w.status) }()
		r, c, err := o.auth.withCaller(r)
		if err != nil {
			noteResult(r, "", nil, err)
			var he *httpError
			if !errors.As(err, &he) {
				err = &httpError{status: http.StatusUnauthorized, msg: err.Error()}
			}
			writeOpenAIError(w, err)
			return
		}
		v, err := fn(w, r, c.tenant)
		noteResult(r, c.tenant, v, err)
		// A long decode may have used up the deadline set on arrival: the answer gets its own.
		o.srv.writeWithin(w, o.writeTimeout)
		if err != nil {
			writeOpenAIError(w, err)
			return
		}
		if v != nil {
			writeJSON(w, http.StatusOK, v)
		}
	})
}

// samplerAlias is the short name /v1/models gives a sampler checkpoint: its name and a digest of
// its path (names repeat across runs, paths do not).
func samplerAlias(path string) string {
	p, err := checkpoint.Parse(path)
	name := "ft"
	if err == nil {
		name = p.Name
	}
	sum := sha256.Sum256([]byte(path))
	return name + "-" + hex.EncodeToString(sum[:4])
}

// ownSamplerCheckpoints lists the tenant's unexpired sampler checkpoints, oldest first.
func (o *openAI) ownSamplerCheckpoints(tenant string) []*ckptMeta {
	return o.srv.checkpointsWhere(func(m *ckptMeta) bool {
		return m.Owner == tenant && m.parsed.Kind == checkpoint.KindSamplerWeights
	})
}

func (o *openAI) listOpenAIModels(w http.ResponseWriter, r *http.Request, tenant string) (any, error) {
	out := api.OpenAIModelList{Object: "list", Data: []api.OpenAIModel{}}
	for _, name := range o.srv.baseModels() {
		out.Data = append(out.Data, api.OpenAIModel{ID: name, Object: "model", OwnedBy: "skein"})
	}
	for _, m := range o.ownSamplerCheckpoints(tenant) {
		out.Data = append(out.Data, api.OpenAIModel{ID: samplerAlias(m.Path), Object: "model", Created: m.Created.Unix(),
			OwnedBy: "you", Root: m.Path, Parent: m.BaseModel})
	}
	return out, nil
}

// openAISampler resolves a request's model to a sampler: a base model, a checkpoint path the
// tenant may read (its own or a published one), or the alias of one of its sampler checkpoints.
// Anything else, another tenant's unpublished checkpoint included, is model_not_found.
func (o *openAI) openAISampler(r *http.Request, tenant, model string) (*sampler, error) {
	if model == "" {
		return nil, badParam("model", "model is required: a base model, a tinker:// sampler checkpoint or an alias from GET /v1/models")
	}
	base, path := "", ""
	switch {
	case strings.Contains(model, "://"):
		if _, err := checkpoint.Parse(model); err != nil {
			return nil, badParam("model", err.Error())
		}
		if _, err := o.srv.checkpointFor(r.Context(), tenant, model); err != nil {
			return nil, modelNotFound(model)
		}
		path = model
	default:
		if _, err := o.srv.replicasOf(model); err == nil {
			base = model
			break
		}
		for _, m := range o.ownSamplerCheckpoints(tenant) {
			if samplerAlias(m.Path) == model {
				path = m.Path
			}
		}
		if path == "" {
			return nil, modelNotFound(model)
		}
	}
	smp, err := o.srv.newSampler(r.Context(), tenant, "", base, path, routingKey(r))
	if err != nil {
		var he *httpError
		if errors.As(err, &he) && he.status == http.StatusNotFound {
			return nil, modelNotFound(model)
		}
		return nil, err
	}
	return o.srv.currentWeights(r.Context(), tenant, smp)
}

// localModel is what the gateway tokenizes text and renders chat templates with for base: an
// in-process replica's model, else the tokenizer its workers published and the config they
// reported (basefiles.go), with where its files are read from.
func (o *openAI) localModel(ctx context.Context, base string) (replica.LocalModel, baseFiles, error) {
	files, m, err := o.srv.filesOf(base)
	if err != nil {
		return replica.LocalModel{}, baseFiles{}, err
	}
	if m.Dir == "" && m.Config != nil { // remote workers': the tokenizer they published
		m.Tokenizer, err = o.srv.storedTokenizer(ctx, files)
		if err != nil && !errors.Is(err, errNoTokenizerFile) {
			return replica.LocalModel{}, baseFiles{}, err
		}
	}
	if m.Tokenizer == nil || m.Config == nil {
		return replica.LocalModel{}, baseFiles{}, badParam("model", "base model "+base+" has no tokenizer.json here (nor published by its workers): this gateway cannot tokenize text for it")
	}
	return m, files, nil
}
