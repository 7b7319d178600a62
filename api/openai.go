package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Wire types of the OpenAI-compatible API (/v1/models, /v1/chat/completions, /v1/completions):
// the subset of OpenAI's shapes that skein serves. Fields OpenAI defines that skein does not
// serve are listed so that a request using them is refused instead of silently ignored.

// OpenAIError is OpenAI's error body: {"error": {...}}.
type OpenAIError struct {
	Error OpenAIErrorBody `json:"error"`
}

// OpenAIErrorBody says what went wrong; Param names the offending request field, if one.
type OpenAIErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// OpenAIModel is one entry of GET /v1/models. Root (the tinker path) and Parent (the base
// model) are set for sampler checkpoints, as vLLM lists its LoRA adapters.
type OpenAIModel struct {
	ID      string `json:"id"`
	Object  string `json:"object"` // "model"
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	Root    string `json:"root,omitempty"`
	Parent  string `json:"parent,omitempty"`
}

// OpenAIModelList is the answer of GET /v1/models.
type OpenAIModelList struct {
	Object string        `json:"object"` // "list"
	Data   []OpenAIModel `json:"data"`
}

// ChatMessage is one message of a chat request. Content is a string or a list of text parts.
type ChatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Name    string          `json:"name,omitempty"`
}

// Text returns the message's content as one string: a string as is, text parts joined.
func (m ChatMessage) Text() (string, error) {
	c := bytes.TrimSpace(m.Content)
	if len(c) == 0 || string(c) == "null" {
		return "", nil
	}
	if c[0] == '"' {
		var s string
		err := json.Unmarshal(c, &s)
		return s, err
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(c, &parts); err != nil {
		return "", errors.New("content must be a string or a list of text parts")
	}
	var b bytes.Buffer
	for _, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("content part of type %q: only text parts are served", p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// StreamOptions are the options of a streamed answer.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// OpenAISampling are the sampling fields chat and text completions share.
type OpenAISampling struct {
	Model            string          `json:"model"`
	MaxTokens        *int            `json:"max_tokens"`
	Temperature      *float64        `json:"temperature"`
	TopP             *float64        `json:"top_p"`
	Seed             *int64          `json:"seed"`
	Stop             json.RawMessage `json:"stop"` // a string or a list of strings
	N                *int            `json:"n"`
	Stream           bool            `json:"stream"`
	StreamOptions    *StreamOptions  `json:"stream_options"`
	PresencePenalty  *float64        `json:"presence_penalty"`
	FrequencyPenalty *float64        `json:"frequency_penalty"`
	LogitBias        map[string]any  `json:"logit_bias"`
	User             string          `json:"user"`
}

// StopStrings decodes stop: absent, null, a string or a list of strings.
func (s OpenAISampling) StopStrings() ([]string, error) {
	c := bytes.TrimSpace(s.Stop)
	if len(c) == 0 || string(c) == "null" {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(c, &one); err == nil {
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(c, &many); err != nil {
		return nil, errors.New("stop must be a string or a list of strings")
	}
	return many, nil
}

// ChatCompletionRequest is the body of POST /v1/chat/completions.
type ChatCompletionRequest struct {
	OpenAISampling
	Messages            []ChatMessage   `json:"messages"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Logprobs            bool            `json:"logprobs"`
	TopLogprobs         *int            `json:"top_logprobs"`
	Tools               json.RawMessage `json:"tools"`
	ResponseFormat      json.RawMessage `json:"response_format"`
}

// CompletionRequest is the body of POST /v1/completions. Prompt is a string, a list of one
// string, or a list of token ids.
type CompletionRequest struct {
	OpenAISampling
	Prompt   json.RawMessage `json:"prompt"`
	Logprobs *int            `json:"logprobs"`
	Echo     bool            `json:"echo"`
	Suffix   *string         `json:"suffix"`
	BestOf   *int            `json:"best_of"`
}

// Usage counts a request's tokens.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// TopLogprob is one alternative of a chat token's logprobs.
type TopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// TokenLogprobInfo is one generated token of a chat choice's logprobs.
type TokenLogprobInfo struct {
	Token       string       `json:"token"`
	Logprob     float64      `json:"logprob"`
	Bytes       []int        `json:"bytes"`
	TopLogprobs []TopLogprob `json:"top_logprobs"`
}

// ChatLogprobs are a chat choice's logprobs.
type ChatLogprobs struct {
	Content []TokenLogprobInfo `json:"content"`
}

// ChatChoiceMessage is the assistant's answer in a chat choice, or a stream chunk's delta.
type ChatChoiceMessage struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// ChatChoice is one of the n answers of a chat completion (Message) or stream chunk (Delta).
type ChatChoice struct {
	Index        int                `json:"index"`
	Message      *ChatChoiceMessage `json:"message,omitempty"`
	Delta        *ChatChoiceMessage `json:"delta,omitempty"`
	Logprobs     *ChatLogprobs      `json:"logprobs"`
	FinishReason *string            `json:"finish_reason"`
}

// ChatCompletion is the answer of a chat completion ("chat.completion") and each chunk of a
// streamed one ("chat.completion.chunk").
type ChatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []ChatChoice `json:"choices"`
	Usage   *Usage       `json:"usage,omitempty"`
}

// CompletionLogprobs are a text choice's logprobs, in the legacy completions shape.
type CompletionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// CompletionChoice is one of the n answers of a text completion, or of a stream chunk.
type CompletionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *CompletionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

// Completion is the answer of a text completion, and each chunk of a streamed one.
type Completion struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"` // "text_completion"
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []CompletionChoice `json:"choices"`
	Usage   *Usage             `json:"usage,omitempty"`
}
