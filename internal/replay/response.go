package replay

import (
	"strconv"
	"strings"

	"github.com/kvpick/kvpick/internal/engine"
	"github.com/kvpick/kvpick/internal/engine/openaiwire"
)

// Response bodies shaped like vLLM's OpenAI server's (docs/replay.md, "Responses"), rendered by
// the same package as the HTTP simulator's: what the picker parses (the usage report, the first
// body byte) must look like the real thing.

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

// responder renders one request's response.
type responder struct{ openaiwire.Response }

func newResponder(r *Request, created int64, details bool) *responder {
	chat := !strings.HasSuffix(r.Path, "/v1/completions")
	id := "cmpl-replay-" + strconv.Itoa(r.ID)
	if chat {
		id = "chatcmpl-replay-" + strconv.Itoa(r.ID)
	}
	return &responder{openaiwire.Response{ID: id, Model: Model, Created: created, Chat: chat, Details: details}}
}

// first is what a stream sends at the first token: for chat, vLLM's role event (assistant,
// empty content), then the first token's text.
func (p *responder) first(res engine.Result) []byte {
	return p.Text(p.Role(nil), res.Text(0, 1), "")
}

// rest is the end of a stream: the text from token `from` on with the finish reason, the usage
// event when the client asked for it, and [DONE].
func (p *responder) rest(res engine.Result, from int, includeUsage bool) []byte {
	var b []byte
	if from == 0 {
		b = p.first(res)
		from = 1
	}
	b = p.Text(b, res.Text(from, max(from, res.CompletionTokens)), string(res.Outcome))
	if includeUsage {
		b = p.UsageEvent(b, res)
	}
	return openaiwire.Done(b)
}
