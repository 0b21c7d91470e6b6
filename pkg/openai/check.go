package openai

import (
	"bytes"
	"fmt"
)

// check applies the per-API member rules to the recorded spans. The body is
// known to be valid JSON here, so the walkers below do not re-validate.
func (r *Request) check() *Error {
	b := r.body
	if err := r.checkModel(); err != nil {
		return err
	}
	switch r.api {
	case APIChatCompletions:
		if err := r.checkMessages(); err != nil {
			return err
		}
		if err := r.checkTools(); err != nil {
			return err
		}
	case APICompletions:
		if err := r.checkPrompt(r.prompt, "prompt", CodeMissingPrompt); err != nil {
			return err
		}
	case APIEmbeddings:
		if err := r.checkPrompt(r.input, "input", CodeMissingInput); err != nil {
			return err
		}
	case APIResponses:
		if v := r.input; !present(b, v) {
			return newError("input", CodeMissingInput, `"input" is required`)
		} else if c := b[v.s]; c != '"' && c != '[' {
			return newError("input", CodeInvalidType, `"input" must be a string or an array`)
		}
		if v := r.instructions; present(b, v) && b[v.s] != '"' {
			return newError("instructions", CodeInvalidType, `"instructions" must be a string`)
		}
		if err := r.checkTools(); err != nil {
			return err
		}
	}
	if v := r.cacheSalt; present(b, v) {
		if b[v.s] != '"' {
			return newError("cache_salt", CodeInvalidType, `"cache_salt" must be a string`)
		}
		r.CacheSalt = r.decodedString(v)
	}
	if v := r.stream; present(b, v) {
		switch b[v.s] {
		case 't':
			r.Stream = true
		case 'f':
		default:
			return newError("stream", CodeInvalidType, `"stream" must be a boolean`)
		}
	}
	return nil
}

// present reports whether v was given and is not null: null members mean
// "absent" throughout, as in the OpenAI API.
func present(b []byte, v span) bool { return v.ok() && b[v.s] != 'n' }

// decodedString returns the (interned) decoded text of the string value v.
func (r *Request) decodedString(v span) string {
	raw := r.body[v.s+1 : v.e-1]
	if bytes.IndexByte(raw, '\\') < 0 {
		return r.intern(raw)
	}
	r.kbuf = appendUnescaped(r.kbuf[:0], raw)
	return r.intern(r.kbuf)
}

func (r *Request) checkModel() *Error {
	b := r.body
	v := r.model
	if !present(b, v) {
		return newError("model", CodeMissingModel, `"model" is required`)
	}
	if b[v.s] != '"' {
		return newError("model", CodeInvalidType, `"model" must be a non-empty string`)
	}
	if v.e-v.s == 2 {
		return newError("model", CodeMissingModel, `"model" is required`)
	}
	r.Model = r.decodedString(v)
	return nil
}

func (r *Request) checkTools() *Error {
	if v := r.tools; present(r.body, v) && r.body[v.s] != '[' {
		return newError("tools", CodeInvalidType, `"tools" must be an array`)
	}
	return nil
}

// checkMessages reports what the scanner found in "messages" (msgCheck).
func (r *Request) checkMessages() *Error {
	b := r.body
	v := r.messages
	if !present(b, v) {
		return newError("messages", CodeMissingMessage, `"messages" is required`)
	}
	if b[v.s] != '[' {
		return newError("messages", CodeInvalidType, `"messages" must be a non-empty array`)
	}
	m := r.msg
	switch {
	case m.n == 0:
		return newError("messages", CodeInvalidValue, `"messages" must be a non-empty array`)
	case m.bad < 0:
		return nil
	case !m.role:
		return newError("messages", m.code, fmt.Sprintf(`"messages[%d]" must be an object`, m.bad))
	case m.code == CodeMissingRole:
		return newError("messages", m.code, fmt.Sprintf(`"messages[%d].role" is required`, m.bad))
	}
	return newError("messages", m.code, fmt.Sprintf(`"messages[%d].role" must be a string`, m.bad))
}

// Prompt shapes accepted by prompt().
const (
	shapeEmpty = iota
	shapeText
	shapeTexts
	shapeTokens
	shapeTokenLists
)

// promptShape classifies a prompt/input value; ok is false when it is none of
// string, array of strings, array of token ids, array of arrays of token ids.
// badToken is set when the shape is right but a number is not a token id.
func (r *Request) promptShape(v span) (shape int, ok, badToken bool) {
	b := r.body
	switch b[v.s] {
	case '"':
		return shapeText, true, false
	case '[':
	default:
		return 0, false, false
	}
	shape = shapeEmpty
	for i := r.first(r.valAt(v.s)); i >= 0; {
		e := r.valAt(i)
		var s int
		switch c := b[i]; {
		case c == '"':
			s = shapeTexts
		case c == '[':
			s = shapeTokenLists
			for j := r.first(e); j >= 0; j = r.next(j) {
				if c := b[j]; c != '-' && !isDigit(c) {
					return 0, false, false
				}
				if _, ok := tokenID(b, j); !ok {
					badToken = true
				}
			}
		case c == '-' || isDigit(c):
			s = shapeTokens
			if _, ok := tokenID(b, i); !ok {
				badToken = true
			}
		default:
			return 0, false, false
		}
		if shape != shapeEmpty && s != shape {
			return 0, false, false
		}
		shape = s
		i = r.after(e.e)
	}
	return shape, true, badToken
}

func (r *Request) checkPrompt(v span, param, missing string) *Error {
	if !present(r.body, v) {
		return newError(param, missing, fmt.Sprintf("%q is required", param))
	}
	_, ok, bad := r.promptShape(v)
	if !ok {
		return newError(param, CodeInvalidType, fmt.Sprintf(
			"%q must be a string, an array of strings, an array of token ids or an array of arrays of token ids", param))
	}
	if bad {
		return newError(param, CodeInvalidValue, fmt.Sprintf("%q: token ids must be integers in [0, 2^32)", param))
	}
	return nil
}

// tokenID parses the number at i as a token id: plain decimal digits (no
// sign, fraction or exponent) with a value below 2^32.
func tokenID(b []byte, i int) (uint32, bool) {
	var x uint64
	j := i
	for ; j < len(b) && isDigit(b[j]); j++ {
		x = x*10 + uint64(b[j]-'0')
		if x > 1<<32-1 {
			return 0, false
		}
	}
	if j == i {
		return 0, false
	}
	if j < len(b) {
		switch b[j] {
		case '.', 'e', 'E':
			return 0, false
		}
	}
	return uint32(x), true
}
