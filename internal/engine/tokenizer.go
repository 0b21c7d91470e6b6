package engine

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// Special token ids, as in Llama 3's tokenizer. Ordinary tokens hash into
// [0, VocabSize) so they never collide with these.
const (
	VocabSize      = 128000
	TokBeginOfText = 128000
	TokEndOfText   = 128001
	TokStartHeader = 128006
	TokEndHeader   = 128007
	TokEOT         = 128009
)

// maxPiece is the longest piece of whitespace or punctuation, and
// maxWordPiece the longest piece of a word (not counting a leading space
// attached to it). With these, English prose comes out at about 4 bytes a
// token (3.9 on the test text), like a real BPE vocabulary, and a 16-token
// block is about 64 bytes.
const (
	maxPiece     = 4
	maxWordPiece = 5
)

// maxDigits mirrors Llama 3, which splits numbers into runs of 1-3 digits.
const maxDigits = 3

type charClass uint8

const (
	clsLetter charClass = iota
	clsDigit
	clsSpace
	clsPunct
)

func classOf(b byte) charClass {
	switch {
	case b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z', b >= 0x80:
		// Bytes of multi-byte UTF-8 runes count as letters: ids are
		// hashes, so splitting inside a rune does no harm.
		return clsLetter
	case b >= '0' && b <= '9':
		return clsDigit
	case b == ' ', b == '\t', b == '\n', b == '\r', b == '\v', b == '\f':
		return clsSpace
	default:
		return clsPunct
	}
}

// TokenID maps one token piece to its id. It is a hash, so there is no
// vocabulary to ship and any text tokenizes.
func TokenID(piece string) uint32 {
	return uint32(xxhash.Sum64String(piece) % VocabSize)
}

// Tokenize splits text into pieces and returns their ids. It stands in for
// a BPE tokenizer: deterministic, context-free and about 4 bytes a token
// on English text. The rules:
//   - a run of letters is cut into pieces of at most 5 bytes; a single
//     space right before it joins its first piece (" quick" is one token);
//   - a run of digits is cut into pieces of at most 3;
//   - other runs of whitespace, and runs of punctuation, are cut into
//     pieces of at most 4 bytes.
func Tokenize(text string) []uint32 {
	return AppendTokens(make([]uint32, 0, len(text)/3+1), text)
}

// AppendTokens appends Tokenize(text) to dst.
func AppendTokens(dst []uint32, text string) []uint32 {
	forEachPiece(text, func(p string) { dst = append(dst, TokenID(p)) })
	return dst
}

// Pieces returns the token pieces of text (for tests and debugging).
func Pieces(text string) []string {
	var out []string
	forEachPiece(text, func(p string) { out = append(out, p) })
	return out
}

func forEachPiece(s string, emit func(string)) {
	i := 0
	for i < len(s) {
		cls := classOf(s[i])
		j := i + 1
		for j < len(s) && classOf(s[j]) == cls {
			j++
		}
		switch cls {
		case clsSpace:
			end := j
			// A single trailing space before a word belongs to the word.
			if s[j-1] == ' ' && j < len(s) && classOf(s[j]) == clsLetter {
				end = j - 1
			}
			chunk(s[i:end], maxPiece, emit)
		case clsLetter:
			start := i
			if i > 0 && s[i-1] == ' ' {
				// Held back by the whitespace rule above.
				start = i - 1
			}
			// The first piece may carry the attached space.
			first := min(i+maxWordPiece, j)
			emit(s[start:first])
			chunk(s[first:j], maxWordPiece, emit)
		case clsDigit:
			chunk(s[i:j], maxDigits, emit)
		default:
			chunk(s[i:j], maxPiece, emit)
		}
		i = j
	}
}

func chunk(s string, n int, emit func(string)) {
	for len(s) > n {
		emit(s[:n])
		s = s[n:]
	}
	if len(s) > 0 {
		emit(s)
	}
}

// hashTokens hashes a token sequence (for deterministic per-prompt choices).
func hashTokens(seed uint64, toks []uint32) uint64 {
	d := xxhash.New()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	_, _ = d.Write(b[:])
	buf := make([]byte, 0, 4*256)
	for len(toks) > 0 {
		n := min(len(toks), 256)
		buf = buf[:0]
		for _, t := range toks[:n] {
			buf = binary.LittleEndian.AppendUint32(buf, t)
		}
		_, _ = d.Write(buf)
		toks = toks[n:]
	}
	return d.Sum64()
}

// mix64 is a cheap deterministic hash of two words (splitmix64 finaliser).
func mix64(a, b uint64) uint64 {
	x := a ^ (b + 0x9e3779b97f4a7c15 + (a << 6) + (a >> 2))
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// outputWords are all at most 4 letters, so " word" is exactly one token
// and the generated text re-tokenizes to the generated ids: a client that
// sends the answer back in its next turn hits the blocks the engine cached
// while generating, as with vLLM.
var outputWords = [...]string{
	"the", "of", "and", "to", "in", "is", "it", "that", "was", "for",
	"on", "are", "with", "as", "be", "at", "by", "this", "have", "from",
	"or", "one", "had", "not", "but", "what", "all", "were", "when", "we",
	"can", "said", "an", "each", "she", "who", "do", "how", "if", "will",
	"up", "out", "many", "then", "them", "so", "some", "her", "must", "make",
	"like", "him", "into", "time", "has", "look", "two", "more", "go", "see",
	"way", "come", "may", "part",
}

// OutputPiece returns the text of output token i of a generation seeded by
// seed: a short word, with a leading space after the first token, and now
// and then a full stop.
func OutputPiece(seed uint64, i int) string {
	h := mix64(seed, uint64(i))
	if isStop(seed, i) {
		return "."
	}
	w := outputWords[(h>>8)%uint64(len(outputWords))]
	if i == 0 {
		return w
	}
	return " " + w
}

// isStop reports whether output token i is a full stop; never two in a row,
// since ".." would tokenize as one piece.
func isStop(seed uint64, i int) bool {
	if i == 0 || mix64(seed, uint64(i))%13 != 0 {
		return false
	}
	return !isStop(seed, i-1)
}

// OutputText returns the text of output tokens [from, to).
func OutputText(seed uint64, from, to int) string {
	var b []byte
	for i := from; i < to; i++ {
		b = append(b, OutputPiece(seed, i)...)
	}
	return string(b)
}
