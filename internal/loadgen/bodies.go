package loadgen

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"unicode/utf8"

	"github.com/kvpick/kvpick/internal/textgen"
)

// Model is the model name the generated requests ask for.
const Model = "meta-llama/Llama-3.1-8B-Instruct"

var roles = []string{
	"a senior site reliability engineer who answers questions about production incidents",
	"a meticulous legal assistant who summarizes contracts clause by clause",
	"a helpful customer support agent for an online store",
	"a careful software engineer who reviews Go and Python code",
	"a research assistant who reads long reports and cites their sections",
	"a friendly tutor who explains mathematics step by step",
	"a data analyst who writes SQL against the warehouse schema below",
	"a travel planner who builds itineraries within a budget",
}

// textGen writes the bodies' text (internal/textgen): prose with a code block one segment in
// 20, so that the JSON carries the escapes real prompts do.
type textGen struct{ r *rand.Rand }

func (g textGen) sentence(sb *strings.Builder) { textgen.Sentence(g.r, sb) }

// text writes about n bytes.
func (g textGen) text(sb *strings.Builder, n int) { textgen.Prose(g.r, sb, n, 20) }

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string         `json:"name"`
		Description string         `json:"description"`
		Parameters  map[string]any `json:"parameters"`
	} `json:"function"`
}

type chatRequest struct {
	Model       string        `json:"model"`
	Messages    []chatMessage `json:"messages"`
	Tools       []chatTool    `json:"tools,omitempty"`
	Stream      bool          `json:"stream"`
	MaxTokens   int           `json:"max_tokens"`
	Temperature float64       `json:"temperature"`
}

// ChatPool is a fixed set of realistic chat-completion bodies: Conversations conversations,
// each sharing one of SystemPrompts system prompts (some with tool definitions), each with a
// multi-turn history, asked Variants different final questions. Requests drawn from it share
// long prefixes (the system prompt across conversations, the whole history within one), so
// a picker's prefix index warms up and matches.
type ChatPool struct {
	Bodies [][]byte // conversation c, variant v at c*Variants+v
	// NonceAt is, per body, the offset of NonceLen placeholder bytes in its final question:
	// Request.Stamp writes a fresh nonce there, so that each request asks something new (its
	// last blocks are new to the index) while its history still matches.
	NonceAt       []int
	Conversations int
	Variants      int
	Bytes         int // total size of Bodies
}

// NewChatPool builds the pool; every body is about bodyBytes long (never under ~1 KB: the
// system prompt and one exchange).
func NewChatPool(seed uint64, conversations, systemPrompts, variants, bodyBytes int) *ChatPool {
	conversations, systemPrompts, variants = max(conversations, 1), max(systemPrompts, 1), max(variants, 1)
	r := rand.New(rand.NewPCG(seed, 0x6b767069636b))
	g := textGen{r}
	type system struct {
		prompt string
		tools  []chatTool
	}
	systems := make([]system, systemPrompts)
	sysBytes := min(max(bodyBytes/16, 600), 6000)
	for i := range systems {
		var sb strings.Builder
		fmt.Fprintf(&sb, "You are %s. Follow these rules:\n", roles[i%len(roles)])
		g.text(&sb, sysBytes)
		systems[i].prompt = sb.String()
		if i%2 == 1 {
			for k := range 3 {
				var t chatTool
				t.Type = "function"
				t.Function.Name = fmt.Sprintf("lookup_%s_%d", textgen.Word(r), k)
				var d strings.Builder
				g.sentence(&d)
				t.Function.Description = d.String()
				t.Function.Parameters = map[string]any{
					"type": "object",
					"properties": map[string]any{
						"id":    map[string]any{"type": "string", "description": "the record to look up"},
						"limit": map[string]any{"type": "integer", "minimum": 1, "maximum": 100},
					},
					"required": []string{"id"},
				}
				systems[i].tools = append(systems[i].tools, t)
			}
		}
	}
	p := &ChatPool{Conversations: conversations, Variants: variants, Bodies: make([][]byte, 0, conversations*variants)}
	const finalBytes = 400
	for c := range conversations {
		s := systems[c%systemPrompts]
		req := chatRequest{Model: Model, Tools: s.tools, Stream: true, MaxTokens: 512, Temperature: 0.7,
			Messages: []chatMessage{{Role: "system", Content: s.prompt}}}
		size := len(s.prompt) + 300
		for turn := 0; turn == 0 || size < bodyBytes-finalBytes-200; turn++ {
			budget := bodyBytes - finalBytes - size
			var u, a strings.Builder
			fmt.Fprintf(&u, "[conversation %d, turn %d] ", c, turn)
			g.text(&u, min(200+r.IntN(1500), max(budget/3, 50)))
			g.text(&a, min(500+r.IntN(3000), max(budget-u.Len(), 50)))
			req.Messages = append(req.Messages, chatMessage{"user", u.String()}, chatMessage{"assistant", a.String()})
			size += u.Len() + a.Len() + 60
		}
		history := req.Messages
		for v := range variants {
			var q strings.Builder
			fmt.Fprintf(&q, "Follow-up %d [%s]: ", v, noncePlaceholder)
			g.text(&q, finalBytes-40)
			req.Messages = append(history[:len(history):len(history)], chatMessage{"user", q.String()})
			b, err := json.Marshal(&req)
			if err != nil {
				panic(err) // plain strings and maps: cannot fail
			}
			p.Bodies = append(p.Bodies, b)
			p.NonceAt = append(p.NonceAt, bytes.LastIndex(b, []byte(noncePlaceholder)))
			p.Bytes += len(b)
		}
	}
	return p
}

// NonceLen is the length of a body's nonce placeholder.
const NonceLen = 16

var noncePlaceholder = strings.Repeat("0", NonceLen)

// UniquePrompts makes chat bodies whose prompts share nothing: each starts with a fresh random
// nonce, so every one of its chained blocks is new to a prefix index.
type UniquePrompts struct {
	base     []byte // text that prompts are cut from, already escaped for a JSON string
	min, max int
}

// NewUniquePrompts returns a generator of prompts between minBytes and maxBytes long.
func NewUniquePrompts(seed uint64, minBytes, maxBytes int) *UniquePrompts {
	minBytes = max(minBytes, 64)
	maxBytes = max(maxBytes, minBytes)
	g := textGen{rand.New(rand.NewPCG(seed, 0x636875726e))}
	var sb strings.Builder
	for sb.Len() < 2*maxBytes+64<<10 {
		g.sentence(&sb)
	}
	q, _ := json.Marshal(sb.String()) // a string always marshals
	return &UniquePrompts{base: q[1 : len(q)-1], min: minBytes, max: maxBytes}
}

const (
	uniqueHead = `{"model":"` + Model + `","stream":true,"max_tokens":256,"messages":[{"role":"user","content":"`
	uniqueTail = `"}]}`
)

// Next appends a new body to buf[:0] and returns it.
func (u *UniquePrompts) Next(r *rand.Rand, buf []byte) []byte {
	n := u.min + r.IntN(u.max-u.min+1)
	off := r.IntN(len(u.base) - n + 1)
	end := off + n
	// Cut where a cut keeps the JSON valid: not inside an escape (the text's only backslashes
	// start escapes) nor inside a multi-byte character.
	for off < end && !u.cut(off) {
		off++
	}
	for end < len(u.base) && !u.cut(end) {
		end++
	}
	buf = append(buf[:0], uniqueHead...)
	buf = fmt.Appendf(buf, "request %016x%016x: ", r.Uint64(), r.Uint64())
	buf = append(buf, u.base[off:end]...)
	return append(buf, uniqueTail...)
}

// cut reports whether the text may be cut before byte i.
func (u *UniquePrompts) cut(i int) bool {
	return i == 0 || i == len(u.base) || utf8.RuneStart(u.base[i]) && u.base[i-1] != '\\'
}
