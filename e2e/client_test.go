//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// client speaks the OpenAI API to the gateway, as an application would.
type client struct {
	base string
	hc   *http.Client
}

func newClient(base string) *client {
	return &client{base: base, hc: &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		MaxIdleConnsPerHost: 128,
		IdleConnTimeout:     30 * time.Second,
	}}}
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	Details          struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// answer is one response as the client saw it.
type answer struct {
	status   int
	header   http.Header
	servedBy string // x-served-by: the simulator that generated it
	text     string // the generated text (message content, or completion text)
	usage    *usage
	events   int    // SSE: data events before [DONE]
	done     bool   // SSE: [DONE] seen
	raw      []byte // the body when it is not a stream
}

func (c *client) chat(ctx context.Context, msgs []message, stream bool, maxTokens int) (*answer, error) {
	return c.post(ctx, "/v1/chat/completions", map[string]any{
		"model": simModel, "messages": msgs, "stream": stream, "max_tokens": maxTokens,
	})
}

func (c *client) complete(ctx context.Context, prompt string, stream bool, maxTokens int) (*answer, error) {
	return c.post(ctx, "/v1/completions", map[string]any{
		"model": simModel, "prompt": prompt, "stream": stream, "max_tokens": maxTokens,
	})
}

func (c *client) post(ctx context.Context, path string, body any) (*answer, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	return c.postRaw(ctx, path, b)
}

// postRaw sends body as is and reads the whole answer, bounded by requestTimeout.
func (c *client) postRaw(ctx context.Context, path string, body []byte) (*answer, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("content-type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	a := &answer{status: resp.StatusCode, header: resp.Header, servedBy: resp.Header.Get("x-served-by")}
	if strings.HasPrefix(resp.Header.Get("content-type"), "text/event-stream") {
		return a, a.readSSE(resp.Body)
	}
	if a.raw, err = io.ReadAll(resp.Body); err != nil {
		return a, err
	}
	if a.status != http.StatusOK {
		return a, nil
	}
	var r struct {
		Choices []struct {
			Text    string `json:"text"`
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Usage *usage `json:"usage"`
	}
	if err := json.Unmarshal(a.raw, &r); err != nil {
		return a, fmt.Errorf("response is not JSON: %v: %.200s", err, a.raw)
	}
	for _, ch := range r.Choices {
		a.text += ch.Text + ch.Message.Content
	}
	a.usage = r.Usage
	return a, nil
}

// readSSE reads a stream of "data: {json}" events up to "data: [DONE]"; every event must be
// JSON.
func (a *answer) readSSE(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			return fmt.Errorf("not an SSE data line: %q", line)
		}
		if data == "[DONE]" {
			a.done = true
			continue
		}
		if a.done {
			return errors.New("data after [DONE]")
		}
		var ev struct {
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *usage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return fmt.Errorf("SSE event is not JSON: %v: %.200s", err, data)
		}
		a.events++
		for _, ch := range ev.Choices {
			a.text += ch.Text + ch.Delta.Content
		}
		if ev.Usage != nil {
			a.usage = ev.Usage
		}
	}
	return sc.Err()
}

// apiError is the OpenAI error body.
type apiError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    any    `json:"code"`
	} `json:"error"`
}

func (a *answer) apiError() (*apiError, error) {
	var e apiError
	if err := json.Unmarshal(a.raw, &e); err != nil || e.Error.Message == "" {
		return nil, fmt.Errorf("not an OpenAI-style JSON error: %q", a.raw)
	}
	return &e, nil
}

// words returns n words of filler text, different for each seed: prompts that share nothing.
func words(seed string, n int) string {
	var sb strings.Builder
	vocab := []string{"cache", "token", "prefix", "router", "server", "model", "block", "query", "batch", "stream",
		"latency", "memory", "kernel", "tensor", "layer", "vector", "shard", "queue", "decode", "prefill"}
	h := uint32(2166136261)
	for _, c := range []byte(seed) {
		h = (h ^ uint32(c)) * 16777619
	}
	for i := 0; i < n; i++ {
		h ^= h << 13
		h ^= h >> 17
		h ^= h << 5
		if i > 0 {
			sb.WriteByte(' ')
		}
		sb.WriteString(vocab[h%uint32(len(vocab))])
	}
	return sb.String()
}
