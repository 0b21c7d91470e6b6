package openaiwire

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvpick/kvpick/internal/engine"
)

func TestUsageDetailsFollowVLLMSerialization(t *testing.T) {
	res := engine.Result{ID: "x", Outcome: engine.OutcomeStop, PromptTokens: 100, CachedTokens: 64, CompletionTokens: 3}
	for _, c := range []struct {
		name           string
		details        bool
		stream, whole  string // substring each must contain
		streamHasField bool
	}{
		{"details on", true, `"prompt_tokens_details":{"cached_tokens":64}`, `"prompt_tokens_details":{"cached_tokens":64}`, true},
		{"details hidden", false, `"usage":{"prompt_tokens":100,"total_tokens":103,"completion_tokens":3}}`, `"prompt_tokens_details":null`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := Response{ID: "chatcmpl-x", Model: "m", Chat: true, Details: c.details}
			ev := string(r.UsageEvent(nil, res))
			if !strings.HasPrefix(ev, "data: {") || !strings.HasSuffix(ev, "}\n\n") || !strings.Contains(ev, c.stream) {
				t.Fatalf("usage event %q, want it to contain %s", ev, c.stream)
			}
			if got := strings.Contains(ev, "prompt_tokens_details"); got != c.streamHasField {
				t.Fatalf("usage event %q: prompt_tokens_details present %v, want %v", ev, got, c.streamHasField)
			}
			if w := string(r.Whole(res)); !strings.Contains(w, c.whole) {
				t.Fatalf("whole body %q, want it to contain %s", w, c.whole)
			}
		})
	}
}

func TestEventsHaveTheEndpointsShape(t *testing.T) {
	for _, c := range []struct {
		name   string
		chat   bool
		object string
		role   bool
	}{
		{"chat", true, "chat.completion.chunk", true},
		{"completions", false, "text_completion", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := Response{ID: "id", Model: "m", Created: 7, Chat: c.chat}
			if got := len(r.Role(nil)) > 0; got != c.role {
				t.Fatalf("role event present %v, want %v", got, c.role)
			}
			ev := r.Text(nil, "hi", "stop")
			var chunk struct {
				Object  string `json:"object"`
				Created int64  `json:"created"`
				Choices []struct {
					Text         *string                   `json:"text"`
					Delta        *struct{ Content string } `json:"delta"`
					FinishReason *string                   `json:"finish_reason"`
				} `json:"choices"`
			}
			if err := json.Unmarshal(ev[len("data: "):len(ev)-2], &chunk); err != nil {
				t.Fatal(err)
			}
			ch := chunk.Choices[0]
			text := ""
			if ch.Text != nil {
				text = *ch.Text
			} else if ch.Delta != nil {
				text = ch.Delta.Content
			}
			if chunk.Object != c.object || chunk.Created != 7 || text != "hi" || ch.FinishReason == nil || *ch.FinishReason != "stop" {
				t.Fatalf("event %s", ev)
			}
			if noFinish := r.Text(nil, "a", ""); !strings.Contains(string(noFinish), `"finish_reason":null`) {
				t.Fatalf("a middle event must carry finish_reason null: %s", noFinish)
			}
		})
	}
}

func TestStreamErrorEndsTheStream(t *testing.T) {
	b := string(StreamError(nil, "boom"))
	if !strings.Contains(b, `"message":"boom"`) || !strings.Contains(b, `"code":500`) || !strings.HasSuffix(b, "data: [DONE]\n\n") {
		t.Fatalf("stream error %q", b)
	}
}
