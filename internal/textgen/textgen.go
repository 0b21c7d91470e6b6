// Package textgen writes pseudo-English for the request bodies of tests, benchmarks and the load
// tools: one word list, sentences, and prose with the line breaks, quotes and code blocks that
// make a JSON body carry escapes as real prompts do. It is deterministic for a given *rand.Rand.
package textgen

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Words is the one word list: frequent English words (so that text tokenizes at about four bytes
// a token, as real prose does), the vocabulary of the domain (model serving, APIs, support
// tickets, contracts), and a few non-ASCII words so that bodies carry multi-byte UTF-8.
var Words = strings.Fields(`the a of to and in is that for it as with was on be by this are from at or an
have not which but all were when we there can their has more one will would been if no other what
about so into its only some could time these two may then do first any my now such like our over
you he she they his her them how said each which do their way many write number sound people know
man me even most made after also did many before must through back years where much your way well
down should because each just those how too little state good very make world still own see water
men work long get here between both life being under never day same another know while last might
us great old year off come since against go came right used take three call find side been thing
cache request server model token prompt latency throughput memory block prefix endpoint gateway
route picker stream batch queue kernel tensor layer attention decode prefill replica cluster node
pod deploy config metric trace function variable return value error handle retry timeout buffer
index table query schema column struct context response hash customer invoice order payment
account shipping refund policy contract clause section report summary analysis chapter paragraph
sentence example question answer detail reason evidence result method warranty package delivery
naïve café résumé — 東京 😀`)

// Word returns a random word of Words.
func Word(r *rand.Rand) string { return Words[r.IntN(len(Words))] }

// Phrase returns n random words separated by spaces.
func Phrase(r *rand.Rand, n int) string {
	var sb strings.Builder
	for i := range n {
		if i > 0 {
			sb.WriteByte(' ')
		}
		sb.WriteString(Word(r))
	}
	return sb.String()
}

// Sentence writes one sentence of 8 to 20 words: the first capitalised, a comma now and then,
// ending with ". " or, one time in three, ".\n".
func Sentence(r *rand.Rand, sb *strings.Builder) {
	n := 8 + r.IntN(13)
	for i := range n {
		w := Word(r)
		if i == 0 {
			c, size := utf8.DecodeRuneInString(w)
			sb.WriteRune(unicode.ToUpper(c))
			sb.WriteString(w[size:])
		} else {
			sb.WriteByte(' ')
			sb.WriteString(w)
		}
		if i < n-1 && r.IntN(12) == 0 {
			sb.WriteByte(',')
		}
	}
	if r.IntN(3) == 0 {
		sb.WriteString(".\n")
	} else {
		sb.WriteString(". ")
	}
}

// CodeBlock writes a short fenced Go function: newlines, tabs, quotes and a %w, the characters
// that JSON escapes.
func CodeBlock(r *rand.Rand, sb *strings.Builder) {
	fmt.Fprintf(sb, "\n\n```go\nfunc handle%d(ctx context.Context) error {\n\tif err := call(%q); err != nil {\n\t\treturn fmt.Errorf(\"%s: %%w\", err)\n\t}\n\treturn nil\n}\n```\n\n",
		r.IntN(1000), Word(r), Word(r))
}

// Prose writes about n bytes (at least n, at most one segment more) of chat text into sb:
// mostly sentences, with paragraph breaks, list items and quoted words, and one segment in
// codeEvery a code block (0: no code). Code is where a JSON body's escapes get dense; the
// package test measures how dense for the values the benchmarks use.
func Prose(r *rand.Rand, sb *strings.Builder, n, codeEvery int) {
	start := sb.Len()
	for sb.Len()-start < n {
		if codeEvery > 0 && r.IntN(codeEvery) == 0 {
			CodeBlock(r, sb)
			continue
		}
		switch k := r.IntN(24); {
		case k == 0:
			sb.WriteString("\n\n")
		case k == 1:
			sb.WriteString("\n- ")
		case k == 2:
			fmt.Fprintf(sb, "%q ", Word(r))
		default:
			Sentence(r, sb)
		}
	}
}

// Text returns about n bytes of Prose.
func Text(r *rand.Rand, n, codeEvery int) string {
	var sb strings.Builder
	sb.Grow(n + 256)
	Prose(r, &sb, n, codeEvery)
	return sb.String()
}
