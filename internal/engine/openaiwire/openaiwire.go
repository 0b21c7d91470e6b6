// Package openaiwire renders the response bodies of vLLM's OpenAI server for
// the simulated engines: the HTTP simulator (internal/engine/httpserver) and
// the replay's in-process responses (internal/replay) write the same bytes,
// because what the picker parses (the usage report, a stream's first byte)
// must look like the real thing wherever it comes from.
package openaiwire

import (
	"encoding/json"

	"github.com/kvpick/kvpick/internal/engine"
)

// Response renders the events and bodies of one request's response.
type Response struct {
	ID      string // "chatcmpl-..." or "cmpl-..."
	Model   string
	Created int64 // Unix seconds
	Chat    bool  // /v1/chat/completions; false: /v1/completions
	// Details puts usage.prompt_tokens_details.cached_tokens in the usage
	// report, as vLLM does only with --enable-prompt-tokens-details.
	Details bool
}

// Usage is OpenAI's usage object as a non-streamed answer carries it: with
// details hidden, "prompt_tokens_details": null.
type Usage struct {
	PromptTokens        int            `json:"prompt_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	PromptTokensDetails *PromptDetails `json:"prompt_tokens_details"`
}

// streamUsage is usage in a stream's usage event: vLLM serializes stream
// chunks without unset fields, so hidden details are absent, not null.
type streamUsage struct {
	PromptTokens        int            `json:"prompt_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	PromptTokensDetails *PromptDetails `json:"prompt_tokens_details,omitempty"`
}

// PromptDetails is usage.prompt_tokens_details.
type PromptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// UsageOf is res's usage report.
func (r Response) UsageOf(res engine.Result) Usage {
	u := Usage{PromptTokens: res.PromptTokens, CompletionTokens: res.CompletionTokens,
		TotalTokens: res.PromptTokens + res.CompletionTokens}
	if r.Details {
		u.PromptTokensDetails = &PromptDetails{CachedTokens: res.CachedTokens}
	}
	return u
}

type delta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chunkChoice struct {
	Index        int     `json:"index"`
	Delta        *delta  `json:"delta,omitempty"` // chat
	Text         *string `json:"text,omitempty"`  // completions
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

type chunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []chunkChoice `json:"choices"`
	Usage   *streamUsage  `json:"usage,omitempty"`
}

// Data appends one server-sent event carrying payload.
func Data(b, payload []byte) []byte {
	b = append(b, "data: "...)
	b = append(b, payload...)
	return append(b, '\n', '\n')
}

// Done appends the [DONE] event that ends every stream.
func Done(b []byte) []byte { return append(b, "data: [DONE]\n\n"...) }

func (r Response) event(b []byte, c chunk) []byte {
	c.ID, c.Created, c.Model = r.ID, r.Created, r.Model
	c.Object = "text_completion"
	if r.Chat {
		c.Object = "chat.completion.chunk"
	}
	j, _ := json.Marshal(c) // plain structs: cannot fail
	return Data(b, j)
}

// Role appends the event a chat stream starts with at its first token (the
// assistant role, empty content); completions have none.
func (r Response) Role(b []byte) []byte {
	if !r.Chat {
		return b
	}
	empty := ""
	return r.event(b, chunk{Choices: []chunkChoice{{Delta: &delta{Role: "assistant", Content: &empty}}}})
}

// Text appends an event with output text; finish, when not empty, is the
// finish reason the last text event carries.
func (r Response) Text(b []byte, text, finish string) []byte {
	c := chunkChoice{}
	if finish != "" {
		c.FinishReason = &finish
	}
	if r.Chat {
		c.Delta = &delta{Content: &text}
	} else {
		c.Text = &text
	}
	return r.event(b, chunk{Choices: []chunkChoice{c}})
}

// UsageEvent appends the usage event a stream sends before [DONE] when the
// client set stream_options.include_usage.
func (r Response) UsageEvent(b []byte, res engine.Result) []byte {
	su := streamUsage(r.UsageOf(res))
	return r.event(b, chunk{Choices: []chunkChoice{}, Usage: &su})
}

// StreamError appends the error event and [DONE] that end a stream whose
// generation failed after its 200 went out.
func StreamError(b []byte, msg string) []byte {
	return Done(Data(b, ErrorBody(500, msg)))
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type choice struct {
	Index        int      `json:"index"`
	Message      *message `json:"message,omitempty"` // chat
	Text         *string  `json:"text,omitempty"`    // completions
	Logprobs     any      `json:"logprobs"`
	FinishReason string   `json:"finish_reason"`
}

// Whole is a non-streamed answer: one JSON object with the text and usage.
func (r Response) Whole(res engine.Result) []byte {
	text := res.Text(0, res.CompletionTokens)
	c := choice{FinishReason: string(res.Outcome)}
	object := "text_completion"
	if r.Chat {
		object = "chat.completion"
		c.Message = &message{Role: "assistant", Content: text}
	} else {
		c.Text = &text
	}
	j, _ := json.Marshal(struct {
		ID      string   `json:"id"`
		Object  string   `json:"object"`
		Created int64    `json:"created"`
		Model   string   `json:"model"`
		Choices []choice `json:"choices"`
		Usage   Usage    `json:"usage"`
	}{r.ID, object, r.Created, r.Model, []choice{c}, r.UsageOf(res)})
	return j
}

// ErrorType is the error type vLLM's server names for an HTTP status.
func ErrorType(status int) string {
	switch status {
	case 400:
		return "BadRequestError"
	case 404:
		return "NotFoundError"
	case 405:
		return "MethodNotAllowed"
	case 503:
		return "ServiceUnavailableError"
	default:
		return "InternalServerError"
	}
}

// ErrorBody is an OpenAI-style error object.
func ErrorBody(status int, msg string) []byte {
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    int     `json:"code"`
		} `json:"error"`
	}
	e.Error.Message, e.Error.Type, e.Error.Code = msg, ErrorType(status), status
	j, _ := json.Marshal(e) // plain struct: cannot fail
	return j
}
