package worker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/skein-ai/skein/engine"
)

// Client is engine.Compute over HTTP to a worker.
type Client struct {
	URL   string
	Token string
	info  engine.ModelInfo
	http  *http.Client
}

// NewClient talks to a worker whose model is described by info (from its registration).
func NewClient(url, token string, info engine.ModelInfo) *Client {
	return &Client{URL: strings.TrimRight(url, "/"), Token: token, info: info, http: &http.Client{Timeout: 30 * time.Minute}}
}

func (c *Client) do(method string, q callRequest) (callResponse, error) {
	var r callResponse
	b, err := json.Marshal(q)
	if err != nil {
		return r, err
	}
	req, err := http.NewRequest(http.MethodPost, c.URL+"/worker/v1/"+method, bytes.NewReader(b))
	if err != nil {
		return r, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.Token != "" {
		req.Header.Set(TokenHeader, c.Token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return r, fmt.Errorf("worker %s unreachable: %w", c.URL, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return r, fmt.Errorf("worker %s: bad answer (%d): %w", c.URL, resp.StatusCode, err)
	}
	if r.Error != "" {
		return r, decodeErr(r)
	}
	return r, nil
}

func (c *Client) Info() engine.ModelInfo { return c.info }

func (c *Client) HasAdapter(id string) bool {
	r, err := c.do("has_adapter", callRequest{ID: id})
	return err == nil && r.Bool
}

func (c *Client) AdapterIDs() []string {
	r, _ := c.do("adapter_ids", callRequest{})
	return r.IDs
}

func (c *Client) CreateLora(id string, cfg engine.LoraConfig) error {
	_, err := c.do("create", callRequest{ID: id, Lora: &cfg})
	return err
}

func (c *Client) LoadAdapter(id, dir string, withOptimizer bool) error {
	_, err := c.do("load", callRequest{ID: id, Dir: dir, WithOptimizer: withOptimizer})
	return err
}

func (c *Client) SaveAdapter(id, dir string, withOptimizer bool) error {
	_, err := c.do("save", callRequest{ID: id, Dir: dir, WithOptimizer: withOptimizer})
	return err
}

func (c *Client) DeleteAdapter(id string) bool {
	r, err := c.do("delete", callRequest{ID: id})
	return err == nil && r.Bool
}

func (c *Client) AdapterInfo(id string) (engine.LoraConfig, int, error) {
	r, err := c.do("adapter_info", callRequest{ID: id})
	if err != nil || r.Lora == nil {
		return engine.LoraConfig{}, 0, err
	}
	return *r.Lora, r.Step, nil
}

func (c *Client) Forward(id string, data []engine.Datum, loss string, cfg map[string]float64) (*engine.ForwardResult, error) {
	r, err := c.do("forward", callRequest{ID: id, Data: data, Loss: loss, LossConfig: cfg})
	return r.Forward, err
}

func (c *Client) ForwardBackward(id string, data []engine.Datum, loss string, cfg map[string]float64) (*engine.ForwardResult, error) {
	r, err := c.do("forward_backward", callRequest{ID: id, Data: data, Loss: loss, LossConfig: cfg})
	return r.Forward, err
}

func (c *Client) OptimStep(id string, p engine.AdamParams) (map[string]float64, error) {
	r, err := c.do("optim_step", callRequest{ID: id, Adam: &p})
	return r.Metrics, err
}

func (c *Client) SampleBatch(id string, reqs []engine.SampleRequest) ([]*engine.SampleResult, error) {
	r, err := c.do("sample", callRequest{ID: id, Samples: reqs})
	if err != nil {
		return nil, err
	}
	if len(r.Samples) != len(reqs) {
		return nil, fmt.Errorf("worker %s answered %d results for %d requests", c.URL, len(r.Samples), len(reqs))
	}
	out := make([]*engine.SampleResult, len(reqs))
	for i, w := range r.Samples {
		out[i] = fromWireSample(w)
	}
	return out, nil
}

var _ engine.Compute = (*Client)(nil)
