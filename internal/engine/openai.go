package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// ErrBadRequest wraps every error of ParseChatCompletion and
// ParseCompletion: the body is not a request the server can run (HTTP 400).
var ErrBadRequest = errors.New("bad request")

// APIRequest is what the simulator takes from an OpenAI request body. It
// lives here, not in the HTTP layer, so a replay tool can turn recorded
// bodies into engine requests exactly as the HTTP simulator does.
type APIRequest struct {
	Model string
	// Prompt is the token ids after the chat template (chat) or of the
	// prompt (completions).
	Prompt []uint32
	// MaxTokens is max_completion_tokens, else max_tokens; 0 when absent.
	MaxTokens int
	Stream    bool
	// IncludeUsage is stream_options.include_usage.
	IncludeUsage bool
	// CacheSalt is vLLM's cache_salt: requests with different salts never
	// share cached blocks.
	CacheSalt string
}

// EngineRequest returns the engine request for r.
func (r *APIRequest) EngineRequest(id string) Request {
	return Request{ID: id, Prompt: r.Prompt, MaxTokens: r.MaxTokens, CacheSalt: r.CacheSalt}
}

type commonBody struct {
	Model               *string `json:"model"`
	MaxTokens           *int    `json:"max_tokens"`
	MaxCompletionTokens *int    `json:"max_completion_tokens"`
	Stream              *bool   `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
	CacheSalt *string `json:"cache_salt"`
}

func (c *commonBody) fill(r *APIRequest) error {
	if c.Model == nil || *c.Model == "" {
		return fmt.Errorf("%w: model is required", ErrBadRequest)
	}
	r.Model = *c.Model
	for _, mt := range []*int{c.MaxTokens, c.MaxCompletionTokens} {
		if mt == nil {
			continue
		}
		if *mt < 1 {
			return fmt.Errorf("%w: max_tokens must be at least 1, got %d", ErrBadRequest, *mt)
		}
		r.MaxTokens = *mt // max_completion_tokens, checked last, wins
	}
	if c.Stream != nil {
		r.Stream = *c.Stream
	}
	if c.StreamOptions != nil && c.StreamOptions.IncludeUsage != nil {
		r.IncludeUsage = *c.StreamOptions.IncludeUsage
	}
	if c.CacheSalt != nil {
		r.CacheSalt = *c.CacheSalt
	}
	return nil
}

// ParseChatCompletion parses a /v1/chat/completions body and applies the
// chat template.
func ParseChatCompletion(body []byte) (*APIRequest, error) {
	var b struct {
		commonBody
		Messages []ChatMessage   `json:"messages"`
		Tools    json.RawMessage `json:"tools"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return nil, fmt.Errorf("%w: invalid JSON: %v", ErrBadRequest, err)
	}
	r := &APIRequest{}
	if err := b.fill(r); err != nil {
		return nil, err
	}
	if len(b.Messages) == 0 {
		return nil, fmt.Errorf("%w: messages must be a non-empty array", ErrBadRequest)
	}
	toks, err := ChatPrompt(b.Messages, b.Tools)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	r.Prompt = toks
	return r, nil
}

// ParseCompletion parses a /v1/completions body. The prompt may be a
// string, an array of token ids (used as given, no BOS added), or a
// one-element array of either; batched prompts are refused.
func ParseCompletion(body []byte) (*APIRequest, error) {
	var b struct {
		commonBody
		Prompt json.RawMessage `json:"prompt"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return nil, fmt.Errorf("%w: invalid JSON: %v", ErrBadRequest, err)
	}
	r := &APIRequest{}
	if err := b.fill(r); err != nil {
		return nil, err
	}
	toks, err := completionPrompt(b.Prompt, true)
	if err != nil {
		return nil, fmt.Errorf("%w: prompt: %v", ErrBadRequest, err)
	}
	r.Prompt = toks
	return r, nil
}

func completionPrompt(raw json.RawMessage, top bool) ([]uint32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, fmt.Errorf("is required")
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return CompletionPrompt(s), nil
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return nil, err
		}
		if len(items) == 0 {
			return nil, fmt.Errorf("must not be empty")
		}
		if first := bytes.TrimSpace(items[0]); len(first) > 0 && (first[0] == '"' || first[0] == '[') {
			if !top {
				return nil, fmt.Errorf("nested too deep")
			}
			if len(items) > 1 {
				return nil, fmt.Errorf("batched prompts (%d) are not supported by the simulator", len(items))
			}
			return completionPrompt(items[0], false)
		}
		ids := make([]uint32, len(items))
		for i, it := range items {
			var v int64
			if err := json.Unmarshal(it, &v); err != nil || v < 0 || v > 0xffffffff {
				return nil, fmt.Errorf("[%d] is not a token id", i)
			}
			ids[i] = uint32(v)
		}
		return ids, nil
	default:
		return nil, fmt.Errorf("must be a string or an array")
	}
}
