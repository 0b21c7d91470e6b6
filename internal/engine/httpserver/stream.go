package httpserver

import (
	"context"
	"fmt"
	"net/http"

	"github.com/kvpick/kvpick/internal/engine"
	"github.com/kvpick/kvpick/internal/engine/openaiwire"
)

// sse writes the events of one stream.
type sse struct {
	w       http.ResponseWriter
	flusher http.Flusher
	wire    openaiwire.Response
	buf     []byte
}

func (s *sse) flush() {
	if s.flusher != nil {
		s.flusher.Flush()
	}
}

// write sends the events rendered into s.buf and flushes them.
func (s *sse) write() bool {
	_, err := s.w.Write(s.buf)
	s.buf = s.buf[:0]
	if err != nil {
		return false
	}
	s.flush()
	return true
}

// text sends output text, with the finish reason (when not empty) on the last event.
func (s *sse) text(text, finish string) bool {
	s.buf = s.wire.Text(s.buf, text, finish)
	return s.write()
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
	out := &sse{w: w, wire: s.wire(id, chat)}
	out.flusher, _ = w.(http.Flusher)
	out.flush()

	step := s.opts.ChunkTokens
	sent := 0 // output tokens sent
	started := false
	for {
		first, produced, done := prog.snapshot()
		if first != nil && !started {
			started = true
			if out.buf = out.wire.Role(out.buf); len(out.buf) > 0 && !out.write() {
				return engine.Result{}, false
			}
		}
		if done != nil {
			return *done, s.finish(out, req, *done, sent)
		}
		// Whole events as tokens come; the last one waits for Done, which
		// carries the finish reason.
		if first != nil {
			for sent+step <= produced && sent+step < first.PlannedTokens {
				if !out.text(first.Text(sent, sent+step), "") {
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
			if !out.text(res.Text(sent, min(sent+step, n)), "") {
				return false
			}
		}
		out.buf = openaiwire.StreamError(out.buf, fmt.Sprintf("the engine failed the request after %d tokens", res.CompletionTokens))
		return out.write()
	}
	for ; sent+step < n; sent += step {
		if !out.text(res.Text(sent, sent+step), "") {
			return false
		}
	}
	if !out.text(res.Text(sent, n), string(res.Outcome)) {
		return false
	}
	if req.IncludeUsage || s.opts.AlwaysUsage {
		out.buf = out.wire.UsageEvent(out.buf, res)
	}
	out.buf = openaiwire.Done(out.buf)
	return out.write()
}
