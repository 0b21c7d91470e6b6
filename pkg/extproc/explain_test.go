package extproc

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kvpick/kvpick/pkg/prefix"
	"github.com/kvpick/kvpick/pkg/router"
)

func prefixMatch(req *router.Request, ep *router.Endpoint) (int, int) {
	m := prefix.MatchesOf(req)
	return m.Blocks(ep), m.Total
}

// explainedStream is a whole chat exchange whose request asks for the explanation header.
func explainedStream(body []byte, ask bool) []*extprocv3.ProcessingRequest {
	hs := []*corev3.HeaderValue{hdr(":method", "POST"), hdr(":path", "/v1/chat/completions"), hdr("x-request-id", "explain-me")}
	if ask {
		hs = append(hs, hdr(ExplainHeader, "1"))
	}
	return []*extprocv3.ProcessingRequest{
		reqHeaders(protocol(fullDuplex, fullDuplex, false), false, hs...), reqBody(body, true),
		respHeaders("200", false), respBody([]byte("data: [DONE]\n\n"), true),
	}
}

// TestDebugLogExplainsEachDecision: at debug level, every decision's log line lists each
// candidate with how much of the prompt it holds, each scorer's score and the total, the picked
// one marked.
func TestDebugLogExplainsEachDecision(t *testing.T) {
	// A JSON core, as in production: the line is encoded when it is written.
	var buf bytes.Buffer
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(&buf), zapcore.DebugLevel)
	eps := []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}
	s, _ := testServer(t, Options{Log: zap.New(core), MatchBlocks: prefixMatch}, eps...)
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + string(make1k()) + `"}]}`)
	for range 2 { // the second time, the first one's endpoint holds the prompt
		if err := s.Process(newScript(explainedStream(body, false)...)); err != nil {
			t.Fatal(err)
		}
	}
	var routed []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatalf("log line %s: %v", l, err)
		}
		if m["msg"] == "routed" {
			routed = append(routed, m)
		}
	}
	if len(routed) != 2 {
		t.Fatalf("%d routed lines, want 2:\n%s", len(routed), buf.String())
	}
	line := routed[1]
	cands, _ := line["candidates"].([]any)
	if len(cands) != len(eps) {
		t.Fatalf("candidates %v, want %d", line["candidates"], len(eps))
	}
	picked := 0
	for _, c := range cands {
		m := c.(map[string]any)
		sc, _ := m["scores"].(map[string]any)
		for _, name := range []string{"prefix-scorer", "prefill-scorer", "cache-room-scorer", "inflight-scorer"} {
			if _, ok := sc[name]; !ok {
				t.Fatalf("candidate %v has no %s score", m, name)
			}
		}
		if m["picked"] == true {
			picked++
			if m["endpoint"] != line["endpoint"] {
				t.Fatalf("picked candidate %v, line's endpoint %v", m["endpoint"], line["endpoint"])
			}
			if m["match_blocks"] == 0.0 || m["match_blocks"] != m["prompt_blocks"] {
				t.Fatalf("the endpoint that served the same prompt holds %v of %v blocks", m["match_blocks"], m["prompt_blocks"])
			}
		}
	}
	if picked != 1 {
		t.Fatalf("%d candidates marked picked", picked)
	}
}

func make1k() []byte {
	b := make([]byte, 1024)
	for i := range b {
		b[i] = 'a' + byte(i%26)
	}
	return b
}

// TestExplainHeaderIsOptIn: the response carries the explanation only when the picker enables
// it and the client asks.
func TestExplainHeaderIsOptIn(t *testing.T) {
	body := []byte(`{"model":"m","prompt":"hello"}`)
	tests := []struct {
		name           string
		enabled, asked bool
	}{
		{"enabled and asked", true, true},
		{"enabled, not asked", true, false},
		{"asked, not enabled", false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := testServer(t, Options{ExplainHeader: tc.enabled, MatchBlocks: prefixMatch}, "10.0.0.1:8000", "10.0.0.2:8000")
			msgs := explainedStream(body, tc.asked)
			msgs[0].GetRequestHeaders().GetHeaders().Headers[1] = hdr(":path", "/v1/completions")
			ss := newScript(msgs...)
			if err := s.Process(ss); err != nil {
				t.Fatal(err)
			}
			got := ""
			for _, r := range ss.out {
				for _, h := range r.GetResponseHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
					if h.GetHeader().GetKey() == ExplainHeader {
						got = string(h.GetHeader().GetRawValue())
					}
				}
			}
			if want := tc.enabled && tc.asked; want != (got != "") {
				t.Fatalf("explanation %q, want one: %v", got, want)
			}
			if got == "" {
				return
			}
			for _, part := range []string{"endpoint=" + routedTo(ss.out) + ";", "prefix-scorer=", "prefill-scorer=", "*4;", "match=", "candidates=2"} {
				if !strings.Contains(got, part) {
					t.Fatalf("explanation %q lacks %q", got, part)
				}
			}
		})
	}
}
