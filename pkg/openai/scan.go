package openai

import (
	"encoding/binary"
	"fmt"
	"math/bits"
)

// scanner validates JSON in one pass and records the structural index that
// Render walks instead of the bytes (nodes: where every string and container
// ends; escs: where every escape is). Strings, the bulk of a prompt, are
// crossed 64 bytes at a time looking for quotes, backslashes and control
// characters (AVX2 where available, word-at-a-time elsewhere); only the
// structure between strings is looked at byte by byte.
type scanner struct {
	b      []byte
	nodes  []node
	escs   []int32
	msg    msgCheck // what the last "messages" array held (chat only)
	errPos int
	errCtx string
	deep   bool
}

// Contexts for syntax error messages.
const (
	ctxValue    = "looking for beginning of value"
	ctxKey      = "looking for beginning of object key string"
	ctxColon    = "after object key"
	ctxObject   = "after object key:value pair"
	ctxArray    = "after array element"
	ctxString   = "in string literal"
	ctxEscape   = "in string escape code"
	ctxNumber   = "in numeric literal"
	ctxLiteral  = "in literal"
	ctxTopLevel = "after top-level value"
)

func (s *scanner) fail(pos int, ctx string) int {
	s.errPos, s.errCtx = pos, ctx
	return -1
}

func (s *scanner) tooDeep(pos int) int {
	s.deep = true
	return s.fail(pos, "")
}

// err turns the recorded failure into an *Error.
func (s *scanner) err() *Error {
	if s.deep {
		return newError("", CodeTooDeep, fmt.Sprintf("JSON nesting deeper than %d at byte %d", MaxDepth, s.errPos))
	}
	var what string
	switch {
	case s.errPos >= len(s.b):
		what = "unexpected end of input"
	case s.errCtx == ctxString && s.b[s.errPos] < 0x20:
		what = fmt.Sprintf("invalid control character %#02x in string literal", s.b[s.errPos])
	default:
		what = fmt.Sprintf("invalid character %s %s", quoteChar(s.b[s.errPos]), s.errCtx)
	}
	return newError("", CodeInvalidJSON, fmt.Sprintf("invalid JSON at byte %d: %s", s.errPos, what))
}

func quoteChar(c byte) string {
	switch {
	case c == '\'':
		return `'\''`
	case c == '"':
		return `'"'`
	case c >= 0x20 && c < 0x7f:
		return "'" + string(c) + "'"
	}
	return fmt.Sprintf("%#02x", c)
}

func skipWS(b []byte, i int) int {
	// Most calls meet no whitespace (compact JSON): one compare decides that.
	for i < len(b) && b[i] <= ' ' {
		switch b[i] {
		case ' ', '\n', '\r', '\t':
			i++
		default:
			return i
		}
	}
	return i
}

// value validates the value starting at or after i (leading whitespace is
// skipped); depth is the nesting of the container holding it. It returns the
// offset after the value, or -1.
func (s *scanner) value(i, depth int) int {
	b := s.b
	i = skipWS(b, i)
	if i >= len(b) {
		return s.fail(i, ctxValue)
	}
	switch c := b[i]; c {
	case '"':
		return s.str(i)
	case '{':
		return s.object(i, depth+1)
	case '[':
		return s.array(i, depth+1)
	case 't':
		return s.lit(i, "true")
	case 'f':
		return s.lit(i, "false")
	case 'n':
		return s.lit(i, "null")
	default:
		if c == '-' || c >= '0' && c <= '9' {
			return s.number(i)
		}
	}
	return s.fail(i, ctxValue)
}

func (s *scanner) lit(i int, w string) int {
	b := s.b
	for k := 1; k < len(w); k++ {
		if i+k >= len(b) {
			return s.fail(i+k, ctxLiteral)
		}
		if b[i+k] != w[k] {
			return s.fail(i+k, ctxLiteral)
		}
	}
	return i + len(w)
}

func isDigit(c byte) bool { return c-'0' < 10 }

func (s *scanner) number(i int) int {
	b := s.b
	j := i
	if b[j] == '-' {
		j++
	}
	if j >= len(b) {
		return s.fail(j, ctxNumber)
	}
	switch c := b[j]; {
	case c == '0':
		j++
	case c >= '1' && c <= '9':
		j++
		for j < len(b) && isDigit(b[j]) {
			j++
		}
	default:
		return s.fail(j, ctxNumber)
	}
	if j < len(b) && b[j] == '.' {
		j++
		if j >= len(b) || !isDigit(b[j]) {
			return s.fail(j, ctxNumber)
		}
		for j < len(b) && isDigit(b[j]) {
			j++
		}
	}
	if j < len(b) && (b[j] == 'e' || b[j] == 'E') {
		j++
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		if j >= len(b) || !isDigit(b[j]) {
			return s.fail(j, ctxNumber)
		}
		for j < len(b) && isDigit(b[j]) {
			j++
		}
	}
	return j
}

func (s *scanner) object(i, depth int) int {
	if depth > MaxDepth {
		return s.tooDeep(i)
	}
	b := s.b
	ni := len(s.nodes)
	s.nodes = append(s.nodes, node{s: int32(i)})
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return s.close(ni, i+1)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return s.fail(i, ctxKey)
		}
		if i = s.str(i); i < 0 {
			return -1
		}
		i = skipWS(b, i)
		if i >= len(b) || b[i] != ':' {
			return s.fail(i, ctxColon)
		}
		if i = s.value(i+1, depth); i < 0 {
			return -1
		}
		i = skipWS(b, i)
		if i >= len(b) {
			return s.fail(i, ctxObject)
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case '}':
			return s.close(ni, i+1)
		default:
			return s.fail(i, ctxObject)
		}
	}
}

// close completes the node of a container that ends at e.
func (s *scanner) close(ni, e int) int {
	s.nodes[ni].e = int32(e)
	s.nodes[ni].x = int32(len(s.nodes))
	return e
}

func (s *scanner) array(i, depth int) int {
	if depth > MaxDepth {
		return s.tooDeep(i)
	}
	b := s.b
	ni := len(s.nodes)
	s.nodes = append(s.nodes, node{s: int32(i)})
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return s.close(ni, i+1)
	}
	for {
		if i = s.value(i, depth); i < 0 {
			return -1
		}
		i = skipWS(b, i)
		if i >= len(b) {
			return s.fail(i, ctxArray)
		}
		switch b[i] {
		case ',':
			i++
		case ']':
			return s.close(ni, i+1)
		default:
			return s.fail(i, ctxArray)
		}
	}
}

// msgCheck is what the scanner learned about a chat "messages" array, so
// that no second walk is needed to check it: how many messages there are and
// the first one that is not an object with a string role.
type msgCheck struct {
	n    int
	bad  int    // index of the first bad message, -1 if none
	code string // CodeInvalidType or CodeMissingRole
	role bool   // the problem is the role (not the message's type)
}

func (c *msgCheck) flag(code string, role bool) {
	if c.bad < 0 {
		c.bad, c.code, c.role = c.n, code, role
	}
}

// messages is array (at depth 2) for a chat "messages" array: it also checks
// each message's shape.
func (s *scanner) messages(i int) int {
	b := s.b
	s.msg = msgCheck{bad: -1}
	ni := len(s.nodes)
	s.nodes = append(s.nodes, node{s: int32(i)})
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return s.close(ni, i+1)
	}
	for {
		if i < len(b) && b[i] == '{' {
			i = s.message(i)
		} else {
			s.msg.flag(CodeInvalidType, false)
			i = s.value(i, 2)
		}
		if i < 0 {
			return -1
		}
		s.msg.n++
		i = skipWS(b, i)
		if i >= len(b) {
			return s.fail(i, ctxArray)
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case ']':
			return s.close(ni, i+1)
		default:
			return s.fail(i, ctxArray)
		}
	}
}

// message is object (at depth 3) for one chat message; it notes the type of
// the last "role" member's value.
func (s *scanner) message(i int) int {
	b := s.b
	ni := len(s.nodes)
	s.nodes = append(s.nodes, node{s: int32(i)})
	role := byte(0) // first byte of the role value; 0: no role member
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		s.msg.flag(CodeMissingRole, true)
		return s.close(ni, i+1)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return s.fail(i, ctxKey)
		}
		ks, x := i, len(s.escs)
		if i = s.str(i); i < 0 {
			return -1
		}
		key := b[ks+1 : i-1]
		isRole := string(key) == "role" || len(s.escs) > x && decodesTo(key, "role")
		i = skipWS(b, i)
		if i >= len(b) || b[i] != ':' {
			return s.fail(i, ctxColon)
		}
		vs := skipWS(b, i+1)
		if i = s.value(vs, 3); i < 0 {
			return -1
		}
		if isRole {
			role = b[vs]
		}
		i = skipWS(b, i)
		if i >= len(b) {
			return s.fail(i, ctxObject)
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case '}':
			switch role {
			case '"':
			case 0, 'n':
				s.msg.flag(CodeMissingRole, true)
			default:
				s.msg.flag(CodeInvalidType, true)
			}
			return s.close(ni, i+1)
		default:
			return s.fail(i, ctxObject)
		}
	}
}

// decodesTo reports whether the escaped string content raw decodes to name
// (a short ASCII name).
func decodesTo(raw []byte, name string) bool {
	if len(raw) > 6*len(name) {
		return false
	}
	var tmp [64]byte
	return string(appendUnescaped(tmp[:0], raw)) == name
}

// str validates the string whose opening quote is at i, records its node and
// escapes, and returns the offset after its closing quote. A 64-byte window's
// stop bytes come back as one bit mask and are handled bit by bit, so
// escape-dense text costs no call and few mispredicted branches per escape;
// windows without stops hand over to indexStop, which crosses long runs at
// SIMD speed.
func (s *scanner) str(i int) int {
	b := s.b
	x := int32(len(s.escs))
	p := i + 1
	// Most strings are short keys and values: if the first stop byte in the
	// next 16 is the closing quote, no window or call is needed.
	if p+16 <= len(b) {
		w := b[p : p+16 : p+16]
		m := stopMask(binary.LittleEndian.Uint64(w[0:8])) & msb
		k := p
		if m == 0 {
			m = stopMask(binary.LittleEndian.Uint64(w[8:16])) & msb
			k += 8
		}
		if m != 0 {
			if k += bits.TrailingZeros64(m) >> 3; b[k] == '"' {
				s.nodes = append(s.nodes, node{int32(i), int32(k + 1), x})
				return k + 1
			}
		}
	}
	escs := s.escs // local: the loop below must not store through s per escape
	for p+64 <= len(b) {
		m := stopMask64(b[p:])
		if m == 0 {
			k := indexStop(b[p+64:])
			if k < 0 {
				s.escs = escs
				return s.fail(len(b), ctxString)
			}
			p += 64 + k
			continue
		}
		for m != 0 {
			k := p + bits.TrailingZeros64(m)
			if b[k] != '\\' {
				s.escs = escs
				if b[k] == '"' {
					s.nodes = append(s.nodes, node{int32(i), int32(k + 1), x})
					return k + 1
				}
				return s.fail(k, ctxString)
			}
			escs = append(escs, int32(k))
			if k+1 >= len(b) {
				s.escs = escs
				return s.fail(k+1, ctxEscape)
			}
			adv := 2
			if c := b[k+1]; c == 'u' {
				for h := 2; h <= 5; h++ {
					if k+h >= len(b) || !isHex(b[k+h]) {
						s.escs = escs
						return s.fail(k+h, ctxEscape)
					}
				}
				adv = 6
			} else if simpleEsc[c] == 0 {
				s.escs = escs
				return s.fail(k+1, ctxEscape)
			}
			sh := k + adv - p
			if sh >= 64 {
				p = k + adv
				goto next
			}
			m &= ^uint64(0) << sh
		}
		p += 64
	next:
	}
	s.escs = escs
	// The last bytes of the body, one at a time.
	for {
		for p < len(b) && !isStop(b[p]) {
			p++
		}
		if p == len(b) {
			return s.fail(p, ctxString)
		}
		switch b[p] {
		case '"':
			s.nodes = append(s.nodes, node{int32(i), int32(p + 1), x})
			return p + 1
		case '\\':
		default:
			return s.fail(p, ctxString)
		}
		s.escs = append(s.escs, int32(p))
		p++
		if p >= len(b) {
			return s.fail(p, ctxEscape)
		}
		if c := b[p]; c == 'u' {
			for k := 1; k <= 4; k++ {
				if p+k >= len(b) || !isHex(b[p+k]) {
					return s.fail(p+k, ctxEscape)
				}
			}
			p += 5
		} else if simpleEsc[c] != 0 {
			p++
		} else {
			return s.fail(p, ctxEscape)
		}
	}
}

// simpleEsc maps the byte after a backslash to the byte it stands for, for
// every escape except \u; 0 means not a valid one-byte escape.
var simpleEsc = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

func isHex(c byte) bool {
	return c-'0' < 10 || (c|0x20)-'a' < 6
}

// scan validates the body and records the spans of the top-level members the
// rendering needs.
func (r *Request) scan() *Error {
	s := scanner{b: r.body, nodes: r.nodes[:0], escs: r.escs[:0]}
	defer func() { r.nodes, r.escs = s.nodes, s.escs }()
	b := s.b
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		if i = s.value(i, 0); i < 0 {
			return s.err()
		}
		if i = skipWS(b, i); i < len(b) {
			s.fail(i, ctxTopLevel)
			return s.err()
		}
		return newError("", CodeInvalidType, "request body must be a JSON object")
	}
	s.nodes = append(s.nodes, node{s: int32(i)})
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		i++
	} else {
		for {
			if i >= len(b) || b[i] != '"' {
				s.fail(i, ctxKey)
				return s.err()
			}
			ks, x := i, len(s.escs)
			ke := s.str(i)
			if ke < 0 {
				return s.err()
			}
			i = skipWS(b, ke)
			if i >= len(b) || b[i] != ':' {
				s.fail(i, ctxColon)
				return s.err()
			}
			key := b[ks+1 : ke-1]
			if len(s.escs) > x {
				r.kbuf = appendUnescaped(r.kbuf[:0], key)
				key = r.kbuf
			}
			sp := r.slot(key)
			vs := skipWS(b, i+1)
			if sp == &r.messages && r.api == APIChatCompletions && vs < len(b) && b[vs] == '[' {
				i = s.messages(vs)
				r.msg = s.msg
			} else {
				i = s.value(vs, 1)
			}
			if i < 0 {
				return s.err()
			}
			if sp != nil {
				*sp = span{vs, i}
			}
			i = skipWS(b, i)
			if i >= len(b) {
				s.fail(i, ctxObject)
				return s.err()
			}
			if b[i] == ',' {
				i = skipWS(b, i+1)
				continue
			}
			if b[i] != '}' {
				s.fail(i, ctxObject)
				return s.err()
			}
			i++
			break
		}
	}
	s.close(0, i)
	if i = skipWS(b, i); i < len(b) {
		s.fail(i, ctxTopLevel)
		return s.err()
	}
	return nil
}

// slot returns where to record the span of top-level member key, or nil.
func (r *Request) slot(key []byte) *span {
	switch string(key) {
	case "model":
		return &r.model
	case "messages":
		return &r.messages
	case "prompt":
		return &r.prompt
	case "input":
		return &r.input
	case "instructions":
		return &r.instructions
	case "tools":
		return &r.tools
	case "cache_salt":
		return &r.cacheSalt
	case "stream":
		return &r.stream
	}
	return nil
}
