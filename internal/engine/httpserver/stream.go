package httpserver

import (
	"context"
	"encoding/json"
	"fmt"
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
	Usage   *streamUsage  `json:"usage,omitempty"`
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

// sse writes the events of one stream.
type sse struct {
	w       http.ResponseWriter
	flusher http.Flusher
	id      string
	object  string
	created int64
	model   string
	chat    bool
}

func (s *sse) flush() {
	if s.flusher != nil {
		s.flusher.Flush()
	}
}

func (s *sse) data(b []byte) bool {
	if _, err := s.w.Write(append(append([]byte("data: "), b...), '\n', '\n')); err != nil {
		return false
	}
	s.flush()
	return true
}

func (s *sse) send(c chunk) bool {
	c.ID, c.Object, c.Created, c.Model = s.id, s.object, s.created, s.model
	b, err := json.Marshal(c)
	return err == nil && s.data(b)
}

// text sends output text, with the finish reason on the last event.
func (s *sse) text(text string, finish *string) bool {
	c := chunkChoice{FinishReason: finish}
	if s.chat {
		c.Delta = &delta{Content: &text}
	} else {
		c.Text = &text
	}
	return s.send(chunk{Choices: []chunkChoice{c}})
}

// stream answers with server-sent events as vLLM does. The status line and
// headers are written and flushed at once, before the engine has scheduled
// anything; the first event (for chat, the assistant role) comes with the
// first token, then an event every ChunkTokens tokens as the engine
// produces them, the last with the finish reason; a usage event if the
// client asked for it (or AlwaysUsage); [DONE]. A failure after the headers
// is an error event, then [DONE]. It reports false if the client went away
// first.
func (s *Server) stream(ctx context.Context, w http.ResponseWriter, req *engine.APIRequest, id string, chat bool, prog *progress) (engine.Result, bool) {
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	out := &sse{w: w, id: id, object: "text_completion", created: s.clock.Now().Unix(), model: s.eng.Config().Model, chat: chat}
	out.flusher, _ = w.(http.Flusher)
	if chat {
		out.object = "chat.completion.chunk"
	}
	out.flush()

	step := s.opts.ChunkTokens
	sent := 0 // output tokens sent
	started := false
	for {
		first, produced, done := prog.snapshot()
		if first != nil && !started {
			started = true
			if chat {
				empty := ""
				if !out.send(chunk{Choices: []chunkChoice{{Delta: &delta{Role: "assistant", Content: &empty}}}}) {
					return engine.Result{}, false
				}
			}
		}
		if done != nil {
			return *done, s.finish(out, req, *done, sent)
		}
		// Whole events as tokens come; the last one waits for Done, which
		// carries the finish reason.
		if first != nil {
			for sent+step <= produced && sent+step < first.PlannedTokens {
				if !out.text(first.Text(sent, sent+step), nil) {
					return engine.Result{}, false
				}
				sent += step
			}
		}
		select {
		case <-prog.wake:
		case <-ctx.Done():
			return engine.Result{}, false
		}
	}
}

// finish ends a stream whose request is done, sent tokens in.
func (s *Server) finish(out *sse, req *engine.APIRequest, res engine.Result, sent int) bool {
	n, step := res.CompletionTokens, s.opts.ChunkTokens
	if failed(res) {
		// The tokens produced before the failure were streamed as they came.
		for ; sent < n; sent += step {
			if !out.text(res.Text(sent, min(sent+step, n)), nil) {
				return false
			}
		}
		var e apiError
		e.Error.Message = fmt.Sprintf("the engine failed the request after %d tokens", res.CompletionTokens)
		e.Error.Type = errorType(http.StatusInternalServerError)
		e.Error.Code = http.StatusInternalServerError
		b, _ := json.Marshal(e)
		return out.data(b) && out.data([]byte("[DONE]"))
	}
	for ; sent+step < n; sent += step {
		if !out.text(res.Text(sent, sent+step), nil) {
			return false
		}
	}
	reason := string(res.Outcome)
	if !out.text(res.Text(sent, n), &reason) {
		return false
	}
	if req.IncludeUsage || s.opts.AlwaysUsage {
		u := s.usageOf(res)
		su := streamUsage(u)
		if !out.send(chunk{Choices: []chunkChoice{}, Usage: &su}) {
			return false
		}
	}
	return out.data([]byte("[DONE]"))
}
