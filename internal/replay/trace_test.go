package replay

import (
	"strings"
	"testing"
	"time"
)

const chatBodyJSON = `{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":5}`

func TestReadTraceGoodLines(t *testing.T) {
	trace := strings.Join([]string{
		`{"timestamp": 1700000010.5, "path": "/v1/chat/completions", "body": ` + chatBodyJSON + `}`,
		``,
		`{"t": 1700000010.0, "request": {"model":"m","prompt":"once upon a time","max_tokens":3}}`,
		`   {"timestamp": 1700000012, "body": "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"as a string\"}]}"}`,
		`{"timestamp": 1700000011, "path": "/openai/v1/completions", "body": {"model":"m","prompt":[1,2,3,4]}}`,
	}, "\n")
	w, err := ReadTrace(strings.NewReader(trace), Spec{})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 4 {
		t.Fatalf("%d requests, want 4", len(w.Requests))
	}
	want := []struct {
		at   time.Duration
		path string
		toks int
	}{
		{0, "/v1/completions", 0},
		{500 * time.Millisecond, "/v1/chat/completions", 0},
		{time.Second, "/openai/v1/completions", 4},
		{2 * time.Second, "/v1/chat/completions", 0},
	}
	for i, r := range w.Requests {
		if r.At != want[i].at || r.Path != want[i].path || r.ID != i || r.After != -1 || len(r.Prompt) == 0 {
			t.Errorf("request %d: at %v path %s id %d after %d prompt %d", i, r.At, r.Path, r.ID, r.After, len(r.Prompt))
		}
		if want[i].toks > 0 && len(r.Prompt) != want[i].toks {
			t.Errorf("request %d: %d prompt tokens, want %d (token ids used as given)", i, len(r.Prompt), want[i].toks)
		}
	}
	if w.Requests[1].MaxTokens != 5 || w.Requests[0].MaxTokens != 3 {
		t.Errorf("max_tokens not taken from the bodies")
	}
	if w.Rate != 1.5 {
		t.Errorf("rate %v, want 3 gaps in 2 s = 1.5", w.Rate)
	}

	// --requests keeps the first ones; --rate rescales the timestamps.
	w, err = ReadTrace(strings.NewReader(trace), Spec{Requests: 3, Rate: 4})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 3 || w.Requests[2].At != 500*time.Millisecond || w.Rate != 4 {
		t.Fatalf("rescaled: %d requests, last at %v, rate %v", len(w.Requests), w.Requests[2].At, w.Rate)
	}
}

func TestReadTraceBadLines(t *testing.T) {
	good := `{"timestamp": 0, "body": ` + chatBodyJSON + `}`
	for _, tc := range []struct{ line, want string }{
		{`not json`, "not a JSON object"},
		{`{"path": "/v1/chat/completions", "body": ` + chatBodyJSON + `}`, `no "timestamp"`},
		{`{"timestamp": -1, "body": ` + chatBodyJSON + `}`, "timestamp -1"},
		{`{"timestamp": "soon", "body": ` + chatBodyJSON + `}`, "bad field"},
		{`{"timestamp": 1}`, `no "body"`},
		{`{"timestamp": 1, "body": [1,2]}`, "body is not a JSON object"},
		{`{"timestamp": 1, "body": {"model":"m"}}`, `neither "messages" nor "prompt"`},
		{`{"timestamp": 1, "path": "/v1/embeddings", "body": {"model":"m","input":"x"}}`, "only /v1/chat/completions"},
		{`{"timestamp": 1, "body": {"messages":[{"role":"user","content":"x"}]}}`, "model is required"},
		{`{"timestamp": 1, "body": {"model":"m","messages":[]}}`, "messages must be a non-empty array"},
	} {
		_, err := ReadTrace(strings.NewReader(good+"\n"+tc.line+"\n"), Spec{})
		if err == nil || !strings.Contains(err.Error(), "line 2") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one naming line 2 and %q", tc.line, err, tc.want)
		}
	}
	if _, err := ReadTrace(strings.NewReader("\n\n"), Spec{}); err == nil {
		t.Error("an empty trace was accepted")
	}
}
