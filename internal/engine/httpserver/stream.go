package httpserver

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/kvpick/kvpick/internal/engine"
)

// chunk is one SSE event, in OpenAI's chat.completion.chunk or streamed
// text_completion shape.
type chunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []chunkChoice `json:"choices"`
	Usage   *usage        `json:"usage,omitempty"`
}

type chunkChoice struct {
	Index        int     `json:"index"`
	Delta        *delta  `json:"delta,omitempty"` // chat
	Text         *string `json:"text,omitempty"`  // completions
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

type delta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// stream answers with server-sent events: headers at once (as vLLM does),
// then a chunk every ChunkTokens tokens at the times the engine's schedule
// gives, the last one with the finish reason, a usage chunk, and [DONE].
// It reports false if the client went away first.
func (s *Server) stream(ctx context.Context, w http.ResponseWriter, req *engine.APIRequest, id string, chat bool, ev *events) (engine.Result, bool) {
	flusher, _ := w.(http.Flusher)
	flush := func() {
		if flusher != nil {
			flusher.Flush()
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flush()

	var first engine.Result
	select {
	case first = <-ev.first:
	case <-ctx.Done():
		return engine.Result{}, false
	}

	model := s.eng.Config().Model
	created := s.clock.Now().Unix()
	object := "text_completion"
	if chat {
		object = "chat.completion.chunk"
	}
	send := func(c chunk) bool {
		c.ID, c.Object, c.Created, c.Model = id, object, created, model
		b, err := json.Marshal(c)
		if err != nil {
			return false
		}
		if _, err := w.Write(append(append([]byte("data: "), b...), '\n', '\n')); err != nil {
			return false
		}
		flush()
		return true
	}
	choice := func(text string, finish *string) []chunkChoice {
		c := chunkChoice{FinishReason: finish}
		if chat {
			c.Delta = &delta{Content: &text}
		} else {
			c.Text = &text
		}
		return []chunkChoice{c}
	}

	if chat {
		empty := ""
		if !send(chunk{Choices: []chunkChoice{{Delta: &delta{Role: "assistant", Content: &empty}}}}) {
			return engine.Result{}, false
		}
	}
	n := first.PlannedTokens
	step := s.opts.ChunkTokens
	last := (n - 1) / step * step // first token of the last chunk
	for from := 0; from < last; from += step {
		to := from + step
		if engine.SleepUntil(ctx, s.clock, first.TokenTime(to-1)) != nil {
			return engine.Result{}, false
		}
		if !send(chunk{Choices: choice(first.Text(from, to), nil)}) {
			return engine.Result{}, false
		}
	}
	var res engine.Result
	select {
	case res = <-ev.done:
	case <-ctx.Done():
		return engine.Result{}, false
	}
	reason := string(res.Outcome)
	if !send(chunk{Choices: choice(res.Text(last, n), &reason)}) {
		return engine.Result{}, false
	}
	if req.IncludeUsage || s.opts.AlwaysUsage {
		if !send(chunk{Choices: []chunkChoice{}, Usage: usageOf(res)}) {
			return engine.Result{}, false
		}
	}
	if _, err := w.Write([]byte("data: [DONE]\n\n")); err != nil {
		return engine.Result{}, false
	}
	flush()
	return res, true
}
