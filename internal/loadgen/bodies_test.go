package loadgen

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestChatPoolBodies(t *testing.T) {
	for _, size := range []int{2048, 64 << 10} {
		p := NewChatPool(1, 8, 2, 2, size)
		if len(p.Bodies) != 16 || len(p.NonceAt) != 16 {
			t.Fatalf("%d bodies, %d nonces", len(p.Bodies), len(p.NonceAt))
		}
		for i, b := range p.Bodies {
			var req chatRequest
			if err := json.Unmarshal(b, &req); err != nil {
				t.Fatalf("size %d body %d: %v", size, i, err)
			}
			if req.Model != Model || len(req.Messages) < 3 || req.Messages[0].Role != "system" {
				t.Fatalf("size %d body %d: %d messages", size, i, len(req.Messages))
			}
			// Every body is about the size asked (never under the system prompt and one turn).
			if size >= 64<<10 && (len(b) < size*3/4 || len(b) > size*5/4) {
				t.Errorf("size %d body %d: %d bytes", size, i, len(b))
			}
		}
		// The variants of one conversation share its history: all but the last message.
		var a, b chatRequest
		_ = json.Unmarshal(p.Bodies[0], &a)
		_ = json.Unmarshal(p.Bodies[1], &b)
		if len(a.Messages) != len(b.Messages) || a.Messages[len(a.Messages)-2] != b.Messages[len(b.Messages)-2] ||
			a.Messages[len(a.Messages)-1] == b.Messages[len(b.Messages)-1] {
			t.Errorf("size %d: two variants of a conversation do not share the history and differ at the end", size)
		}
	}
}

func TestUniquePromptsAreValidAndUnique(t *testing.T) {
	u := NewUniquePrompts(1, 100, 3000)
	r := rand.New(rand.NewPCG(1, 2))
	seen := map[string]bool{}
	var buf []byte
	for i := range 2000 {
		buf = u.Next(r, buf)
		var req chatRequest
		if err := json.Unmarshal(buf, &req); err != nil {
			t.Fatalf("prompt %d is not JSON: %v\n%s", i, err, buf)
		}
		prompt := req.Messages[0].Content
		if n := len(prompt); n < 100 || n > 3000+100 {
			t.Fatalf("prompt %d: %d bytes", i, n)
		}
		head := prompt[:min(len(prompt), 48)]
		if seen[head] || !strings.HasPrefix(prompt, "request ") {
			t.Fatalf("prompt %d starts like another one: %q", i, head)
		}
		seen[head] = true
	}
}
