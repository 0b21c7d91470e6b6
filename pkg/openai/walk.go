package openai

import (
	"bytes"
	"unicode/utf16"
	"unicode/utf8"
)

// The walkers in this file run only over a body that Parse accepted, so they
// do not re-validate; they still bounds-check through Go slices, so a body
// mutated after Parse cannot make them corrupt memory.

// val is the span [s,e) of a value and, for strings and containers, the
// index n of its node (-1 for numbers and literals).
type val struct{ s, e, n int }

// lookup returns the index of the node that starts at i. Walks are mostly
// sequential, so the cursor usually answers; otherwise a binary search does.
func (r *Request) lookup(i int) int {
	t := r.nodes
	if c := r.cur; c < len(t) && int(t[c].s) == i {
		return c
	}
	lo, hi := 0, len(t)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if int(t[m].s) < i {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// valAt measures the value starting at i and moves the cursor past it.
func (r *Request) valAt(i int) val {
	b := r.body
	switch b[i] {
	case '"':
		n := r.lookup(i)
		r.cur = n + 1
		return val{i, int(r.nodes[n].e), n}
	case '{', '[':
		n := r.lookup(i)
		r.cur = int(r.nodes[n].x)
		return val{i, int(r.nodes[n].e), n}
	}
	return val{i, numEnd(b, i), -1}
}

// numEnd returns the offset after the number or literal starting at i.
func numEnd(b []byte, i int) int {
	for i < len(b) {
		switch c := b[i]; {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'z', c == '.', c == '-', c == '+', c == 'E':
			i++
		default:
			return i
		}
	}
	return i
}

// first returns the offset of the first element (array) or first key
// (object) of the container v, or -1 when it is empty, and points the cursor
// at the container's first child.
func (r *Request) first(v val) int {
	b := r.body
	r.cur = v.n + 1
	i := skipWS(b, v.s+1)
	if b[i] == ']' || b[i] == '}' {
		return -1
	}
	return i
}

// after returns the offset of the element (or key) following a value that
// ends at e, or -1 at the end of the container.
func (r *Request) after(e int) int {
	b := r.body
	e = skipWS(b, e)
	if b[e] == ',' {
		return skipWS(b, e+1)
	}
	return -1
}

// next skips the value at i and returns the offset of the following element
// (or key), or -1 at the end of the container.
func (r *Request) next(i int) int { return r.after(r.valAt(i).e) }

// hasEsc reports whether the string value v contains escapes.
func (r *Request) hasEsc(v val) bool {
	x := int(r.nodes[v.n].x)
	return x < len(r.escs) && int(r.escs[x]) < v.e
}

// appendUnescaped appends the decoded text of the valid JSON string content
// s (without quotes) to dst. Invalid surrogates decode to U+FFFD, like
// encoding/json.
func appendUnescaped(dst, s []byte) []byte {
	for {
		k := bytes.IndexByte(s, '\\')
		if k < 0 {
			return append(dst, s...)
		}
		dst = append(dst, s[:k]...)
		var buf [8]byte
		n, adv := unescape(s[k:], buf[:])
		dst = append(dst, buf[:n]...)
		s = s[k+adv:]
	}
}

// unescape decodes the escape sequence at the start of s (s[0] == '\\') into
// buf (at least 8 bytes) and returns the bytes written and the bytes of s
// consumed.
func unescape(s []byte, buf []byte) (n, adv int) {
	if len(s) < 2 {
		return 0, len(s)
	}
	switch c := s[1]; c {
	case 'b':
		buf[0] = '\b'
	case 'f':
		buf[0] = '\f'
	case 'n':
		buf[0] = '\n'
	case 'r':
		buf[0] = '\r'
	case 't':
		buf[0] = '\t'
	case 'u':
		c1 := hex4(s[2:])
		if c1 < 0 {
			return 0, len(s)
		}
		adv = 6
		if utf16.IsSurrogate(rune(c1)) {
			c2 := -1
			if len(s) >= 12 && s[6] == '\\' && s[7] == 'u' {
				c2 = hex4(s[8:])
			}
			if d := utf16.DecodeRune(rune(c1), rune(c2)); d != utf8.RuneError {
				return utf8.EncodeRune(buf, d), 12
			}
			c1 = utf8.RuneError
		}
		return utf8.EncodeRune(buf, rune(c1)), adv
	default: // '"', '\\', '/'
		buf[0] = c
	}
	return 1, 2
}

func hex4(s []byte) int {
	if len(s) < 4 {
		return -1
	}
	x := 0
	for _, c := range s[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		x = x<<4 | int(c)
	}
	return x
}
