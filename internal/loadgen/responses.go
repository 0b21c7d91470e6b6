package loadgen

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/kvpick/kvpick/internal/dataplane"
	"github.com/kvpick/kvpick/internal/textgen"
)

// playback is the response the load generator plays to the picker for one served endpoint,
// encoded once (each message carries the served endpoint in its metadata, as Envoy sends it).
type playback struct {
	headers *dataplane.Encoded
	whole   *dataplane.Encoded   // a short answer in one chunk, with the end of stream
	tokens  []*dataplane.Encoded // one token per chunk
	done    *dataplane.Encoded   // finish_reason and [DONE], with the end of stream
}

// sseChunk is one server-sent event of a streamed chat completion, as vLLM writes it.
func sseChunk(delta, finish string) string {
	return fmt.Sprintf(`data: {"id":"chatcmpl-loadgen","object":"chat.completion.chunk","created":1764547200,"model":%q,"choices":[{"index":0,"delta":%s,"logprobs":null,"finish_reason":%s}]}`+"\n\n",
		Model, delta, finish)
}

// The response bodies. wholeResponse is a short answer of 8 tokens and [DONE] in one ~1.8 KB
// chunk; tokenChunks are single-token events of ~220 bytes (a word each); doneChunk ends a
// token stream.
var (
	wholeResponse = func() []byte {
		var sb strings.Builder
		for i := range 8 {
			sb.WriteString(sseChunk(fmt.Sprintf(`{"content":"token%d "}`, i), "null"))
		}
		sb.WriteString("data: [DONE]\n\n")
		return []byte(sb.String())
	}()
	tokenChunks = func() [][]byte {
		r := rand.New(rand.NewPCG(7, 11))
		out := make([][]byte, 64)
		for i := range out {
			out[i] = []byte(sseChunk(fmt.Sprintf(`{"content":%q}`, " "+textgen.Word(r)), "null"))
		}
		return out
	}()
	doneChunk = []byte(sseChunk("{}", `"stop"`) + "data: [DONE]\n\n")
)

// TokenChunkBytes is the mean size of a token chunk.
func TokenChunkBytes() int {
	n := 0
	for _, c := range tokenChunks {
		n += len(c)
	}
	return n / len(tokenChunks)
}

func newPlayback(served string) *playback {
	p := &playback{
		headers: dataplane.PrepareResponseHeaders(200, []dataplane.Header{{Key: "content-type", Value: "text/event-stream"}}, served, false),
		whole:   dataplane.PrepareResponseChunk(wholeResponse, served, true),
		done:    dataplane.PrepareResponseChunk(doneChunk, served, true),
	}
	for _, c := range tokenChunks {
		p.tokens = append(p.tokens, dataplane.PrepareResponseChunk(c, served, false))
	}
	return p
}
