package replay

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/kvpick/kvpick/internal/engine"
)

// Response bodies shaped like vLLM's OpenAI server's (docs/replay.md, "Responses"): what the
// picker parses (the usage report, the first body byte) must look like the real thing.

// ResponseTiming says when the picker sees the response headers.
const (
	// TimingVLLM is how vLLM and SGLang answer: a streamed request's status and headers are
	// written when the request arrives (before queueing and prefill), its first SSE event at
	// the first token; a non-streamed request gets headers and the whole body at the end.
	TimingVLLM = "vllm"
	// TimingFirstToken is the replay's former timing, kept for comparison: headers (and a
	// stream's first event) at the first token, whatever the request.
	TimingFirstToken = "first-token"
)

// ResponseTimings lists the accepted timings.
func ResponseTimings() []string { return []string{TimingVLLM, TimingFirstToken} }

type usageJSON struct {
	PromptTokens     int `json:"prompt_tokens"`
	TotalTokens      int `json:"total_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	// PromptTokensDetails is null unless the server runs with --enable-prompt-tokens-details.
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func usageOf(res engine.Result, details bool) *usageJSON {
	u := &usageJSON{PromptTokens: res.PromptTokens, CompletionTokens: res.CompletionTokens,
		TotalTokens: res.PromptTokens + res.CompletionTokens}
	if details {
		u.PromptTokensDetails = &struct {
			CachedTokens int `json:"cached_tokens"`
		}{res.CachedTokens}
	}
	return u
}

type deltaJSON struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chunkChoice struct {
	Index        int        `json:"index"`
	Delta        *deltaJSON `json:"delta,omitempty"` // chat
	Text         *string    `json:"text,omitempty"`  // completions
	Logprobs     any        `json:"logprobs"`
	FinishReason *string    `json:"finish_reason"`
}

type chunkJSON struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []chunkChoice `json:"choices"`
	Usage   *usageJSON    `json:"usage,omitempty"`
}

// responder renders one request's response.
type responder struct {
	id      string
	chat    bool
	model   string
	created int64
	details bool // usage carries prompt_tokens_details.cached_tokens
}

func newResponder(r *Request, created int64, details bool) *responder {
	chat := !strings.HasSuffix(r.Path, "/v1/completions")
	id := "cmpl-replay-" + strconv.Itoa(r.ID)
	if chat {
		id = "chatcmpl-replay-" + strconv.Itoa(r.ID)
	}
	return &responder{id: id, chat: chat, model: Model, created: created, details: details}
}

func (p *responder) event(b []byte, c chunkJSON) []byte {
	c.ID, c.Created, c.Model = p.id, p.created, p.model
	c.Object = "text_completion"
	if p.chat {
		c.Object = "chat.completion.chunk"
	}
	j, _ := json.Marshal(c) // plain structs: cannot fail
	b = append(b, "data: "...)
	b = append(b, j...)
	return append(b, '\n', '\n')
}

func (p *responder) content(text string, finish *string) chunkJSON {
	c := chunkChoice{FinishReason: finish}
	if p.chat {
		c.Delta = &deltaJSON{Content: &text}
	} else {
		c.Text = &text
	}
	return chunkJSON{Choices: []chunkChoice{c}}
}

// first is what a stream sends at the first token: for chat, vLLM's role event (assistant,
// empty content), then the first token's text.
func (p *responder) first(res engine.Result) []byte {
	var b []byte
	if p.chat {
		empty := ""
		b = p.event(b, chunkJSON{Choices: []chunkChoice{{Delta: &deltaJSON{Role: "assistant", Content: &empty}}}})
	}
	return p.event(b, p.content(res.Text(0, 1), nil))
}

// rest is the end of a stream: the text from token `from` on with the finish reason, the usage
// event when the client asked for it, and [DONE].
func (p *responder) rest(res engine.Result, from int, includeUsage bool) []byte {
	var b []byte
	if from == 0 {
		b = p.first(res)
		from = 1
	}
	reason := string(res.Outcome)
	b = p.event(b, p.content(res.Text(from, max(from, res.CompletionTokens)), &reason))
	if includeUsage {
		b = p.event(b, chunkJSON{Choices: []chunkChoice{}, Usage: usageOf(res, p.details)})
	}
	return append(b, "data: [DONE]\n\n"...)
}

// streamError is the event a stream ends with when generation fails after the headers went out
// (the status is already 200).
func (p *responder) streamError(msg string) []byte {
	j, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": "InternalServerError", "code": 500}})
	return append(append([]byte("data: "), j...), "\n\ndata: [DONE]\n\n"...)
}

type messageJSON struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type choiceJSON struct {
	Index        int          `json:"index"`
	Message      *messageJSON `json:"message,omitempty"`
	Text         *string      `json:"text,omitempty"`
	Logprobs     any          `json:"logprobs"`
	FinishReason string       `json:"finish_reason"`
}

// whole is a non-streamed response: one JSON object with the text and the usage.
func (p *responder) whole(res engine.Result) []byte {
	text := res.Text(0, res.CompletionTokens)
	c := choiceJSON{FinishReason: string(res.Outcome)}
	object := "text_completion"
	if p.chat {
		object = "chat.completion"
		c.Message = &messageJSON{Role: "assistant", Content: text}
	} else {
		c.Text = &text
	}
	j, _ := json.Marshal(struct {
		ID      string       `json:"id"`
		Object  string       `json:"object"`
		Created int64        `json:"created"`
		Model   string       `json:"model"`
		Choices []choiceJSON `json:"choices"`
		Usage   *usageJSON   `json:"usage"`
	}{p.id, object, p.created, p.model, []choiceJSON{c}, usageOf(res, p.details)})
	return j
}

// errorBody is an OpenAI-style error answer sent before any output.
func errorBody(status int, msg string) []byte {
	typ := "InternalServerError"
	switch status {
	case 400:
		typ = "BadRequestError"
	case 503:
		typ = "ServiceUnavailableError"
	}
	j, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": status}})
	return j
}
