package replay

import (
	"math"
	"math/rand/v2"
	"strings"

	"github.com/cespare/xxhash/v2"

	"github.com/kvpick/kvpick/internal/engine"
)

// newRand returns a generator seeded by seed and a stream name, so that each part of a workload
// draws from its own stream: changing one size does not reshuffle the others.
func newRand(seed uint64, stream string) *rand.Rand {
	h := xxhash.Sum64String(stream)
	return rand.New(rand.NewPCG(seed, h^0x9e3779b97f4a7c15))
}

var syllables = [...]string{
	"ka", "to", "ri", "ne", "mo", "la", "su", "pe", "di", "vo", "ra", "me", "ti", "lo", "ba", "fe",
	"gi", "hu", "ja", "ku", "ze", "xo", "ny", "wa", "pro", "str", "an", "en", "in", "on", "us", "ex",
	"ter", "con", "ver", "tion", "al", "ic", "ment", "ous", "ing", "ed", "er", "ly", "ab", "om",
}

// words: frequent short words, like real prose, so the text tokenizes at about 4-5 bytes a token.
var commonWords = [...]string{
	"the", "of", "and", "to", "in", "is", "it", "that", "for", "on", "with", "as", "be", "at", "by",
	"this", "from", "or", "not", "but", "what", "all", "when", "can", "each", "how", "if", "will",
	"out", "then", "so", "some", "make", "like", "into", "has", "more", "way", "may", "use", "any",
}

// wordTokens is how many tokens the stand-in tokenizer gives " word" (letters only): pieces of
// at most five letters, the leading space joining the first.
func wordTokens(w string) int { return (len(w) + 4) / 5 }

// prose writes about n tokens of pseudo-English into b: sentences of common and made-up words.
// Different random streams give different text, so unrelated prompts share nothing.
func prose(rng *rand.Rand, b *strings.Builder, n int) {
	toks, inSentence := 0, 0
	for toks < n {
		var w string
		if rng.IntN(5) < 2 {
			w = commonWords[rng.IntN(len(commonWords))]
		} else {
			k := 1 + rng.IntN(3)
			var sb strings.Builder
			for range k {
				sb.WriteString(syllables[rng.IntN(len(syllables))])
			}
			w = sb.String()
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		if inSentence == 0 {
			w = strings.ToUpper(w[:1]) + w[1:]
		}
		b.WriteString(w)
		toks += wordTokens(w)
		inSentence++
		if inSentence >= 6 && rng.IntN(8) == 0 || inSentence >= 20 {
			b.WriteByte('.')
			toks++
			inSentence = 0
		} else if rng.IntN(12) == 0 {
			b.WriteByte(',')
			toks++
		}
	}
	if inSentence > 0 {
		b.WriteByte('.')
	}
}

// text returns about n tokens of prose.
func text(rng *rand.Rand, n int) string {
	var b strings.Builder
	b.Grow(n * 5)
	prose(rng, &b, n)
	return b.String()
}

// logNormal draws exp(N(ln median, sigma)) clamped to [lo, hi].
func logNormal(rng *rand.Rand, median, sigma float64, lo, hi int) int {
	v := int(math.Round(median * math.Exp(sigma*rng.NormFloat64())))
	return max(lo, min(hi, v))
}

// uniform draws an int in [lo, hi].
func uniform(rng *rand.Rand, lo, hi int) int { return lo + rng.IntN(hi-lo+1) }

// answerer computes what the simulated engines answer to a prompt: a server's output depends
// only on the prompt and the engines' seed, so a conversation's next turn can carry the exact
// text the engine produced — which re-tokenizes to the tokens it cached while generating.
type answerer struct {
	clk *engine.VirtualClock
	eng *engine.Engine
}

func newAnswerer(cfg engine.Config) (*answerer, error) {
	cfg.NumGPUBlocks = 1 << 15
	cfg.MaxModelLen = 0
	cfg.MaxNumSeqs = 1
	cfg.MaxWaiting = 0
	cfg.ErrorRate, cfg.SlowRate, cfg.HangRate = 0, 0, 0
	clk := engine.NewVirtualClock(Epoch)
	eng, err := engine.New(cfg, clk)
	if err != nil {
		return nil, err
	}
	return &answerer{clk: clk, eng: eng}, nil
}

func (a *answerer) answer(prompt []uint32, maxTokens int) (string, error) {
	var res engine.Result
	if _, err := a.eng.Submit(engine.Request{Prompt: prompt, MaxTokens: maxTokens},
		engine.Callbacks{Done: func(r engine.Result) { res = r }}); err != nil {
		return "", err
	}
	a.clk.RunUntilIdle()
	return res.Text(0, res.CompletionTokens), nil
}
