package extproc_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvpick/kvpick/internal/dataplane"
)

// TestPrefillChargeFollowsTheServersTiming drives one request through the real server the way
// vLLM answers it: a stream's headers come when the request reaches the server, before its
// prefill, so they must leave the request's prefill charge in place; its first body chunk (the
// first token) pays it back. A non-streamed response's headers come with the whole answer and
// pay it back at once.
func TestPrefillChargeFollowsTheServersTiming(t *testing.T) {
	for _, stream := range []bool{true, false} {
		name := map[bool]string{true: "streamed", false: "non-streamed"}[stream]
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, nil)
			body, _ := json.Marshal(map[string]any{"model": "m", "stream": stream,
				"messages": []map[string]string{{"role": "user", "content": strings.Repeat("a prompt of some length. ", 80)}}})
			x, err := h.client.Open(context.Background(), dataplane.FullDuplex())
			if err != nil {
				t.Fatal(err)
			}
			defer x.Close()
			r, err := x.Request(post("/v1/chat/completions", body))
			if err != nil || r.Immediate != nil {
				t.Fatalf("routing: %v %+v", err, r)
			}
			ep := h.pk.Pool.Lookup(r.Destination)
			if ep == nil {
				t.Fatalf("destination %q not in the pool", r.Destination)
			}
			charged := ep.QueuedPrefill()
			if charged < 10 {
				t.Fatalf("a cold ~30-block prompt charged %d blocks", charged)
			}
			if _, imm, err := x.ResponseHeaders(200, []dataplane.Header{{Key: "content-type", Value: "text/event-stream"}}, r.Destination, false); err != nil || imm != nil {
				t.Fatalf("response headers: %v %+v", err, imm)
			}
			want := charged
			if !stream {
				want = 0
			}
			if q := ep.QueuedPrefill(); q != want {
				t.Fatalf("after the response headers the queue is %d, want %d", q, want)
			}
			if err := x.ResponseBody([]byte(`data: {"choices":[{"delta":{"role":"assistant"}}]}`+"\n\n"), false); err != nil {
				t.Fatal(err)
			}
			if _, _, err := x.NextResponseBody(context.Background()); err != nil {
				t.Fatal(err)
			}
			if q := ep.QueuedPrefill(); q != 0 {
				t.Fatalf("after the first body chunk the queue is %d, want 0", q)
			}
			if err := x.ResponseBody([]byte("data: [DONE]\n\n"), true); err != nil {
				t.Fatal(err)
			}
		})
	}
}
