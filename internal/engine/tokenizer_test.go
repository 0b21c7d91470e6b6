package engine

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

const english = `The quick brown fox jumps over the lazy dog. In the beginning of the
twentieth century, physicists discovered that light behaves both as a wave and as a
particle, which changed how scientists thought about the nature of reality. Modern
language models read text as tokens rather than characters; a typical English word
becomes one or two tokens, and punctuation usually becomes a token of its own.
Routing requests to the server that already holds their prefix in its cache saves
the time it would take to compute that prefix again.`

func TestTokenizePieces(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"hello world", []string{"hello", " world"}},
		{"beginnings of", []string{"begin", "nings", " of"}},
		{"the cat", []string{"the", " cat"}},
		{"a  b", []string{"a", " ", " b"}},
		{"x\n\ny", []string{"x", "\n\n", "y"}},
		{"12345", []string{"123", "45"}},
		{`{"a":1}`, []string{`{"`, "a", `":`, "1", "}"}},
		{"", nil},
		{"   ", []string{"   "}},
		{"cafés", []string{"caf\xc3\xa9", "s"}},
	}
	for _, tt := range tests {
		if got := Pieces(tt.in); !slices.Equal(got, tt.want) {
			t.Errorf("Pieces(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if got := strings.Join(Pieces(tt.in), ""); got != tt.in {
			t.Errorf("pieces of %q do not rejoin: %q", tt.in, got)
		}
	}
}

func TestTokenizeDeterministicAndFourBytes(t *testing.T) {
	a, b := Tokenize(english), Tokenize(english)
	if !slices.Equal(a, b) {
		t.Fatal("Tokenize is not deterministic")
	}
	ratio := float64(len(english)) / float64(len(a))
	t.Logf("%d bytes, %d tokens, %.2f bytes/token", len(english), len(a), ratio)
	if ratio < 3.5 || ratio > 4.8 {
		t.Errorf("bytes per token = %.2f, want about 4", ratio)
	}
	for _, id := range a {
		if id >= VocabSize {
			t.Fatalf("ordinary token id %d collides with special ids", id)
		}
	}
}

func TestOutputTextRetokenizes(t *testing.T) {
	for seed := uint64(0); seed < 200; seed++ {
		n := 1 + int(seed%97)
		var want []uint32
		for i := range n {
			want = append(want, TokenID(OutputPiece(seed, i)))
		}
		text := OutputText(seed, 0, n)
		if got := Tokenize(text); !slices.Equal(got, want) {
			t.Fatalf("seed %d: text %q tokenizes to %d ids, want the %d generated ones", seed, text, len(got), n)
		}
	}
}

func msgs(pairs ...string) []ChatMessage {
	var out []ChatMessage
	for i := 0; i+1 < len(pairs); i += 2 {
		c, _ := json.Marshal(pairs[i+1])
		out = append(out, ChatMessage{Role: pairs[i], Content: c})
	}
	return out
}

func TestChatPrompt(t *testing.T) {
	conv := msgs("system", "You are terse.", "user", "What is a KV cache?")
	base, err := ChatPrompt(conv, nil)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := ChatPrompt(conv, nil)
	if !slices.Equal(base, again) {
		t.Fatal("ChatPrompt is not deterministic")
	}
	if base[0] != TokBeginOfText || base[1] != TokStartHeader {
		t.Errorf("prompt starts %v, want begin_of_text, start_header", base[:2])
	}
	tail := append([]uint32{TokEOT, TokStartHeader}, Tokenize("assistant")...)
	tail = append(append(tail, TokEndHeader), Tokenize("\n\n")...)
	if !slices.Equal(base[len(base)-len(tail):], tail) {
		t.Errorf("prompt does not end with the assistant generation header")
	}

	parts := json.RawMessage(`[{"type":"text","text":"What is a "},{"type":"text","text":"KV cache?"}]`)
	withParts := msgs("system", "You are terse.")
	withParts = append(withParts, ChatMessage{Role: "user", Content: parts})
	img := json.RawMessage(`[{"type":"text","text":"see"},{"type":"image_url","image_url":{"url":"http://x/a.png"}}]`)
	img2 := json.RawMessage(`[{"type":"text","text":"see"},{"type":"image_url","image_url":{"url":"http://x/b.png"}}]`)
	imgStr := json.RawMessage(`[{"type":"text","text":"see"},{"type":"image_url","image_url":"http://x/a.png"}]`)
	tools1 := json.RawMessage(`[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":2}}}]`)
	tools2 := json.RawMessage(`[ {"function": {"parameters": {"a": 2, "b": 1}, "name": "f"}, "type": "function"} ]`)

	render := func(m []ChatMessage, tools json.RawMessage) []uint32 {
		t.Helper()
		p, err := ChatPrompt(m, tools)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	user := func(c json.RawMessage) []ChatMessage { return []ChatMessage{{Role: "user", Content: c}} }
	textOnly := render(user(json.RawMessage(`"see"`)), nil)

	tests := []struct {
		name string
		a, b []uint32
		same bool
	}{
		{"text parts concatenate like a string", base, render(withParts, nil), true},
		{"tools key order and spacing do not matter", render(conv, tools1), render(conv, tools2), true},
		{"tools change the prompt", base, render(conv, tools1), false},
		{"image url string or object", render(user(img), nil), render(user(imgStr), nil), true},
		{"different images differ", render(user(img), nil), render(user(img2), nil), false},
	}
	for _, tt := range tests {
		if got := slices.Equal(tt.a, tt.b); got != tt.same {
			t.Errorf("%s: equal = %v, want %v", tt.name, got, tt.same)
		}
	}
	if d := len(render(user(img), nil)) - len(textOnly); d != ImagePartTokens {
		t.Errorf("image adds %d tokens, want %d", d, ImagePartTokens)
	}
	if toolsLen := len(render(conv, tools1)) - len(base); toolsLen < 20 {
		t.Errorf("tools add only %d tokens", toolsLen)
	}
}

func TestChatPromptToolsAndParts(t *testing.T) {
	calls := json.RawMessage(`[{"id":"c1","type":"function","function":{"name":"get","arguments":"{}"}}]`)
	conv := []ChatMessage{
		{Role: "user", Content: json.RawMessage(`"weather?"`)},
		{Role: "assistant", Content: json.RawMessage(`null`), ToolCalls: calls},
		{Role: "tool", Content: json.RawMessage(`"sunny"`)},
	}
	p, err := ChatPrompt(conv, nil)
	if err != nil {
		t.Fatal(err)
	}
	noCalls := slices.Clone(conv)
	noCalls[1].ToolCalls = nil
	q, _ := ChatPrompt(noCalls, nil)
	if len(p)-len(q) < 10 {
		t.Errorf("tool calls add %d tokens", len(p)-len(q))
	}
	if !containsRun(p, Tokenize("ipython")) {
		t.Error("tool role is not rendered as ipython")
	}
	audio := json.RawMessage(`[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]`)
	a, err := ChatPrompt([]ChatMessage{{Role: "user", Content: audio}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, _ := ChatPrompt([]ChatMessage{{Role: "user", Content: json.RawMessage(`""`)}}, nil)
	if len(a)-len(e) != ImagePartTokens {
		t.Errorf("audio part adds %d tokens, want %d", len(a)-len(e), ImagePartTokens)
	}
}

func containsRun(s, sub []uint32) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if slices.Equal(s[i:i+len(sub)], sub) {
			return true
		}
	}
	return false
}

func TestChatPromptTurnsArePrefixes(t *testing.T) {
	turn1 := msgs("system", "Be brief.", "user", "Tell me about caches.")
	turn2 := append(slices.Clone(turn1), msgs("assistant", "Caches keep data close.", "user", "And KV caches?")...)
	p1, _ := ChatPrompt(turn1, nil)
	p2, _ := ChatPrompt(turn2, nil)
	if len(p2) <= len(p1) || !slices.Equal(p2[:len(p1)], p1) {
		t.Fatal("turn 1's prompt is not a prefix of turn 2's")
	}
}

func TestChatPromptErrors(t *testing.T) {
	tests := []struct {
		name  string
		msgs  []ChatMessage
		tools json.RawMessage
	}{
		{"missing role", []ChatMessage{{Content: json.RawMessage(`"x"`)}}, nil},
		{"content number", []ChatMessage{{Role: "user", Content: json.RawMessage(`5`)}}, nil},
		{"part without type", []ChatMessage{{Role: "user", Content: json.RawMessage(`[{"text":"x"}]`)}}, nil},
		{"image without url", []ChatMessage{{Role: "user", Content: json.RawMessage(`[{"type":"image_url"}]`)}}, nil},
		{"tools not array", msgs("user", "x"), json.RawMessage(`{"a":1}`)},
	}
	for _, tt := range tests {
		if _, err := ChatPrompt(tt.msgs, tt.tools); err == nil {
			t.Errorf("%s: no error", tt.name)
		}
	}
}

func TestParseRequests(t *testing.T) {
	chat := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":7,"stream":true,"stream_options":{"include_usage":true},"cache_salt":"s"}`
	r, err := ParseChatCompletion([]byte(chat))
	if err != nil {
		t.Fatal(err)
	}
	if r.Model != "m" || r.MaxTokens != 7 || !r.Stream || !r.IncludeUsage || r.CacheSalt != "s" || len(r.Prompt) == 0 {
		t.Errorf("parsed %+v", r)
	}
	r, err = ParseChatCompletion([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":7,"max_completion_tokens":9}`))
	if err != nil || r.MaxTokens != 9 {
		t.Errorf("max_completion_tokens: %v %+v", err, r)
	}

	c, err := ParseCompletion([]byte(`{"model":"m","prompt":"hello there"}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := CompletionPrompt("hello there"); !slices.Equal(c.Prompt, want) || c.Prompt[0] != TokBeginOfText {
		t.Errorf("completion prompt %v, want %v", c.Prompt, want)
	}
	for _, body := range []string{`{"model":"m","prompt":[1,2,3]}`, `{"model":"m","prompt":[[1,2,3]]}`} {
		c, err := ParseCompletion([]byte(body))
		if err != nil || !slices.Equal(c.Prompt, []uint32{1, 2, 3}) {
			t.Errorf("%s: %v %v", body, err, c)
		}
	}

	bad := []struct {
		chat bool
		body string
	}{
		{true, `{`},
		{true, `{"messages":[{"role":"user","content":"hi"}]}`},
		{true, `{"model":"","messages":[{"role":"user","content":"hi"}]}`},
		{true, `{"model":"m","messages":[]}`},
		{true, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":0}`},
		{true, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1.5}`},
		{false, `{"model":"m"}`},
		{false, `{"model":"m","prompt":[]}`},
		{false, `{"model":"m","prompt":["a","b"]}`},
		{false, `{"model":"m","prompt":[-1]}`},
		{false, `{"model":"m","prompt":5}`},
	}
	for _, b := range bad {
		var err error
		if b.chat {
			_, err = ParseChatCompletion([]byte(b.body))
		} else {
			_, err = ParseCompletion([]byte(b.body))
		}
		if err == nil {
			t.Errorf("%s: no error", b.body)
		}
	}
}
