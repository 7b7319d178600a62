package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
)

// Exchange is one recorded request and its response, as written by Recorder (one JSON object a
// line). Bodies are kept as text when they are JSON and base64 otherwise (protobuf).
type Exchange struct {
	Method         string            `json:"method"`
	Path           string            `json:"path"`
	Headers        map[string]string `json:"headers"`
	RequestJSON    json.RawMessage   `json:"request_json,omitempty"`
	RequestBinary  []byte            `json:"request_binary,omitempty"`
	Status         int               `json:"status"`
	ResponseType   string            `json:"response_content_type"`
	ResponseJSON   json.RawMessage   `json:"response_json,omitempty"`
	ResponseBinary []byte            `json:"response_binary,omitempty"`
}

// recordedHeaders are the request headers kept (the API key is replaced by its tenant's label).
var recordedHeaders = []string{"Content-Type", "Content-Encoding", "Accept", "User-Agent", "X-Tinker-Request-Type"}

// RecordedTenantHeader names the tenant (the hash of the key, never the key) of a recorded request.
const RecordedTenantHeader = "X-Skein-Recorded-Tenant"

// Recorder wraps a handler and appends every exchange to a JSONL file: the way skein records
// the real SDK's traffic for the replay tests (`skein serve --record FILE`).
func Recorder(next http.Handler, path string) (http.Handler, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The body is recorded as the handler reads it, never read ahead: the handler's size limit
		// (MaxBodyBytes) bounds what is read, and so what is held here.
		tee := &teeBody{ReadCloser: r.Body}
		r.Body = tee
		rec := &captureWriter{ResponseWriter: w, status: 200}
		next.ServeHTTP(rec, r)
		body := tee.buf.Bytes()
		ex := Exchange{Method: r.Method, Path: r.URL.RequestURI(), Headers: map[string]string{}, Status: rec.status,
			ResponseType: rec.Header().Get("Content-Type")}
		for _, h := range recordedHeaders {
			if v := r.Header.Get(h); v != "" {
				ex.Headers[h] = v
			}
		}
		if tenant, err := tenantOf(r); err == nil {
			ex.Headers[RecordedTenantHeader] = tenant // which caller: a replay sends each tenant's requests with its key
		}
		if json.Valid(body) && len(body) > 0 {
			ex.RequestJSON = body
		} else if len(body) > 0 {
			ex.RequestBinary = body
		}
		if strings.Contains(ex.ResponseType, "json") && json.Valid(rec.buf.Bytes()) {
			ex.ResponseJSON = rec.buf.Bytes()
		} else {
			ex.ResponseBinary = rec.buf.Bytes()
		}
		if strings.HasPrefix(r.URL.Path, v1+"skein/keys") {
			ex.ResponseJSON, ex.ResponseBinary = nil, nil // a new key is shown once, never written down
		}
		line, _ := json.Marshal(ex)
		mu.Lock()
		_, _ = f.Write(append(line, '\n'))
		mu.Unlock()
	}), nil
}

// teeBody keeps a copy of what is read from a request body.
type teeBody struct {
	io.ReadCloser
	buf bytes.Buffer
}

func (t *teeBody) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	t.buf.Write(p[:n])
	return n, err
}

type captureWriter struct {
	http.ResponseWriter
	status int
	buf    bytes.Buffer
}

func (c *captureWriter) WriteHeader(s int) { c.status = s; c.ResponseWriter.WriteHeader(s) }

// Unwrap lets http.ResponseController reach the connection (write deadlines).
func (c *captureWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

func (c *captureWriter) Write(b []byte) (int, error) {
	c.buf.Write(b)
	return c.ResponseWriter.Write(b)
}
