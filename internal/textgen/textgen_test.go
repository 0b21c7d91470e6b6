package textgen

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestProseIsDeterministicValidAndSized(t *testing.T) {
	for _, n := range []int{1, 100, 4096, 64 << 10} {
		for _, codeEvery := range []int{0, 5, 12} {
			a := Text(rand.New(rand.NewPCG(7, 1)), n, codeEvery)
			b := Text(rand.New(rand.NewPCG(7, 1)), n, codeEvery)
			c := Text(rand.New(rand.NewPCG(8, 1)), n, codeEvery)
			if a != b {
				t.Fatalf("n=%d codeEvery=%d: the same seed gave different text", n, codeEvery)
			}
			if n >= 100 && a == c {
				t.Errorf("n=%d codeEvery=%d: different seeds gave the same text", n, codeEvery)
			}
			if !utf8.ValidString(a) {
				t.Errorf("n=%d codeEvery=%d: invalid UTF-8", n, codeEvery)
			}
			// At least n bytes, and at most one segment (a code block or a sentence of 20
			// words) more.
			if len(a) < n || len(a) > n+400 {
				t.Errorf("n=%d codeEvery=%d: %d bytes", n, codeEvery, len(a))
			}
			if hasCode := strings.Contains(a, "```go"); codeEvery == 0 && hasCode {
				t.Errorf("n=%d: a code block with codeEvery 0", n)
			}
		}
	}
}

// escapesPerKB counts the bytes JSON escapes in text, per KB of text.
func escapesPerKB(text string) float64 {
	b, _ := json.Marshal(text)
	return float64(len(b)-2-len(text)) / float64(len(text)) * 1024
}

// TestEscapeDensity pins what the parser benchmarks (pkg/openai) rely on: more code, more
// escapes, and no code, few.
func TestEscapeDensity(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	none, normal, heavy := escapesPerKB(Text(r, 256<<10, 0)), escapesPerKB(Text(r, 256<<10, 12)), escapesPerKB(Text(r, 256<<10, 5))
	t.Logf("escaped bytes per KB: no code %.1f, code every 12 segments %.1f, every 5 %.1f", none, normal, heavy)
	if !(none < normal && normal < heavy) {
		t.Errorf("escape density does not grow with code: %.1f, %.1f, %.1f per KB", none, normal, heavy)
	}
	if heavy < 1.5*normal {
		t.Errorf("code-heavy text (%.1f per KB) is not markedly denser than normal text (%.1f)", heavy, normal)
	}
}

func TestSentenceCapitalisesMultiByteWords(t *testing.T) {
	for seed := range uint64(200) {
		var sb strings.Builder
		Sentence(rand.New(rand.NewPCG(seed, 3)), &sb)
		s := sb.String()
		if !utf8.ValidString(s) {
			t.Fatalf("seed %d: invalid UTF-8 %q", seed, s)
		}
		if !strings.HasSuffix(s, ". ") && !strings.HasSuffix(s, ".\n") {
			t.Fatalf("seed %d: sentence does not end with a full stop: %q", seed, s)
		}
		if n := len(strings.Fields(s)); n < 8 || n > 20 {
			t.Fatalf("seed %d: %d words", seed, n)
		}
	}
}

func TestPhrase(t *testing.T) {
	p := Phrase(rand.New(rand.NewPCG(1, 1)), 5)
	if n := len(strings.Fields(p)); n != 5 {
		t.Errorf("Phrase(5) = %q: %d words", p, n)
	}
	if Phrase(rand.New(rand.NewPCG(1, 1)), 0) != "" {
		t.Error("Phrase(0) is not empty")
	}
}
