package openai

import (
	"bytes"
	"encoding/binary"
	"slices"
)

// Separators of the rendering (docs/rendering.md): control bytes that cannot
// appear unescaped in JSON text.
const (
	RS = 0x1e // starts a section or message
	US = 0x1f // separates a label from its value, and content parts
	GS = 0x1d // starts a further member of a message
)

// Render writes the canonical rendering (docs/rendering.md) of the parsed
// request into s. Unescaped runs of at least directMin bytes are passed as
// sub-slices of the body; everything else is batched in a scratch buffer, so
// Render does not allocate once the Request's scratch space has grown.
// Render after a failed Parse, after Reset, or for APIOther writes nothing.
// The body passed to Parse must not change before Render returns.
func (r *Request) Render(s Sink) {
	if r.body == nil || s == nil {
		return
	}
	r.sink, r.n = s, 0
	b := r.body
	switch r.api {
	case APIChatCompletions:
		r.renderTools()
		for i := r.first(r.valAt(r.messages.s)); i >= 0; {
			i = r.item(i, false)
		}
	case APICompletions:
		r.label(RS, "prompt")
		r.promptValue(r.prompt)
	case APIEmbeddings:
		r.label(RS, "input")
		r.promptValue(r.input)
	case APIResponses:
		r.renderTools()
		if v := r.instructions; present(b, v) {
			r.label(RS, "instructions")
			r.text(r.valAt(v.s))
		}
		if v := r.valAt(r.input.s); b[v.s] == '"' {
			r.label(RS, "user")
			r.text(v)
		} else {
			for i := r.first(v); i >= 0; {
				i = r.item(i, true)
			}
		}
	}
	r.flush()
	r.sink = nil
}

// renderTools writes the tools section when tools is a non-empty array.
func (r *Request) renderTools() {
	if !present(r.body, r.tools) {
		return
	}
	v := r.valAt(r.tools.s)
	if r.first(v) < 0 {
		return
	}
	r.label(RS, "tools")
	r.canon(v)
}

// label writes sep, name, US.
func (r *Request) label(sep byte, name string) {
	if r.n+len(name)+2 > outCap {
		r.flush()
	}
	r.out[r.n] = sep
	r.n++
	r.n += copy(r.out[r.n:], name)
	r.out[r.n] = US
	r.n++
}

func (r *Request) flush() {
	if r.n > 0 {
		r.sink.Write(r.out[:r.n])
		r.n = 0
	}
}

func (r *Request) put(p []byte) {
	if len(p) >= directMin {
		r.flush()
		r.sink.Write(p)
		return
	}
	if r.n+len(p) > outCap {
		r.flush()
	}
	r.n += copy(r.out[r.n:], p)
}

func (r *Request) putByte(c byte) {
	if r.n == outCap {
		r.flush()
	}
	r.out[r.n] = c
	r.n++
}

// text writes the decoded content of the string value v. The scanner
// recorded where the escapes are (r.escs), so the runs between them are
// copied without searching: short runs and one-byte escapes by decodeRuns,
// whose loop makes no calls (so its state stays in registers); long runs
// go to the sink straight from the body; \u escapes go through unescape.
func (r *Request) text(v val) {
	b := r.body
	p, e := v.s+1, v.e-1
	escs := r.escs
	j := int(r.nodes[v.n].x)
	if j >= len(escs) || int(escs[j]) >= e {
		r.put(b[p:e])
		return
	}
	for {
		r.n, p, j = decodeRuns(&r.out, r.n, b, p, e, escs, j)
		if j >= len(escs) || int(escs[j]) >= e {
			break
		}
		// decodeRuns stopped before escs[j]: a long run, a full buffer,
		// the end of the body or a \u escape.
		x := int(escs[j])
		j++
		if x < p {
			continue // second half of a surrogate pair
		}
		r.put(b[p:x])
		if r.n+8 > outCap {
			r.flush()
		}
		if d := simpleEsc[b[x+1]]; d != 0 {
			r.out[r.n] = d
			r.n++
			p = x + 2
			continue
		}
		k, adv := unescape(b[x:e], r.out[r.n:])
		r.n += k
		p = x + adv
	}
	if p < e {
		r.put(b[p:e])
	}
}

// decodeRuns appends to out[n:] the runs of b between the escapes escs[j:]
// that lie before e, each followed by its one-byte escape, for as long as
// runs are shorter than directMin (copied 16 bytes at a time into the slack
// of out) and out has room. It returns the new n, the offset of the first
// byte not consumed and the index of the first escape not consumed.
func decodeRuns(out *[outCap + 32]byte, n int, b []byte, p, e int, escs []int32, j int) (int, int, int) {
	for ; j < len(escs); j++ {
		x := int(escs[j])
		run := x - p
		if x >= e || run < 0 || run >= directMin || n+run+32 > outCap || x+32 > len(b) {
			break
		}
		d := simpleEsc[b[x+1]]
		if d == 0 {
			break
		}
		*(*[16]byte)(out[n : n+16]) = *(*[16]byte)(b[p : p+16])
		*(*[16]byte)(out[n+16 : n+32]) = *(*[16]byte)(b[p+16 : p+32])
		for k := 32; k < run; k += 16 {
			*(*[16]byte)(out[n+k : n+k+16]) = *(*[16]byte)(b[p+k : p+k+16])
		}
		n += run
		out[n] = d
		n++
		p = x + 2
	}
	return n, p, j
}

// canon writes canon(v): compact JSON with decoded strings, sorted keys and
// null members dropped.
func (r *Request) canon(v val) {
	b := r.body
	switch b[v.s] {
	case '"':
		r.putByte('"')
		r.text(v)
		r.putByte('"')
	case '{':
		base, kb := len(r.mem), len(r.kbuf)
		r.collect(v)
		r.object(base, -1)
		r.mem, r.kbuf = r.mem[:base], r.kbuf[:kb]
		r.cur = int(r.nodes[v.n].x) // members rendered out of order
	case '[':
		r.putByte('[')
		for i := r.first(v); i >= 0; {
			e := r.valAt(i)
			r.canon(e)
			if i = r.after(e.e); i >= 0 {
				r.putByte(',')
			}
		}
		r.putByte(']')
	default: // numbers as written, true, false, null
		r.put(b[v.s:v.e])
	}
}

// collect appends the members of the object v to r.mem, sorted by decoded
// key (stable, so among duplicates the last one stays last and wins).
func (r *Request) collect(v val) {
	b := r.body
	base := len(r.mem)
	for k := r.first(v); k >= 0; {
		key := r.valAt(k)
		m := member{ks: k + 1, ke: key.e - 1}
		if r.hasEsc(key) {
			st := len(r.kbuf)
			r.kbuf = appendUnescaped(r.kbuf, b[k+1:key.e-1])
			m.ks, m.ke, m.inK = st, len(r.kbuf), true
		}
		m.v = r.valAt(skipWS(b, skipWS(b, key.e)+1))
		r.mem = append(r.mem, m)
		k = r.after(m.v.e)
	}
	ms := r.mem[base:]
	if len(ms) <= 16 {
		for j := 1; j < len(ms); j++ {
			for k := j; k > 0 && bytes.Compare(r.key(&ms[k]), r.key(&ms[k-1])) < 0; k-- {
				ms[k], ms[k-1] = ms[k-1], ms[k]
			}
		}
		return
	}
	slices.SortStableFunc(ms, func(x, y member) int { return bytes.Compare(r.key(&x), r.key(&y)) })
}

func (r *Request) key(m *member) []byte {
	if m.inK {
		return r.kbuf[m.ks:m.ke]
	}
	return r.body[m.ks:m.ke]
}

// winner reports whether r.mem[j] is the last of its key among the sorted
// members r.mem[:n] (duplicate keys: the last one wins).
func (r *Request) winner(j, n int) bool {
	return j+1 >= n || !bytes.Equal(r.key(&r.mem[j]), r.key(&r.mem[j+1]))
}

// find returns the index of the winning member named name in r.mem[base:],
// or -1.
func (r *Request) find(base int, name string) int {
	n := len(r.mem)
	for j := n - 1; j >= base; j-- {
		if string(r.key(&r.mem[j])) == name {
			return j
		}
	}
	return -1
}

// object writes the sorted members r.mem[base:] as a canon object, leaving
// out null values, duplicates that lose, and member skip.
func (r *Request) object(base, skip int) {
	r.putByte('{')
	first := true
	for j, n := base, len(r.mem); j < n; j++ {
		m := r.mem[j]
		if j == skip || r.body[m.v.s] == 'n' || !r.winner(j, n) {
			continue
		}
		if !first {
			r.putByte(',')
		}
		first = false
		r.putByte('"')
		r.put(r.key(&m))
		r.putByte('"')
		r.putByte(':')
		r.canon(m.v)
	}
	r.putByte('}')
}

// strIs reports whether the string value v decodes to s.
func (r *Request) strIs(v val, s string) bool {
	raw := r.body[v.s+1 : v.e-1]
	if string(raw) == s {
		return true
	}
	if len(raw) <= len(s) || !r.hasEsc(v) {
		return false // escapes only make a string shorter when decoded
	}
	kb := len(r.kbuf)
	r.kbuf = appendUnescaped(r.kbuf, raw)
	eq := string(r.kbuf[kb:]) == s
	r.kbuf = r.kbuf[:kb]
	return eq
}

// item renders a chat message, or a responses input item (responses true):
// an object with a string role renders as a message, anything else as
// RS type US canon(item without type). It returns the offset of the next
// item, or -1.
func (r *Request) item(i int, responses bool) int {
	b := r.body
	v := r.valAt(i)
	if b[i] != '{' {
		r.label(RS, "")
		r.canon(v)
		return r.after(v.e)
	}
	if r.plainMessage(v) {
		return r.after(v.e)
	}
	base, kb := len(r.mem), len(r.kbuf)
	r.collect(v)
	role := r.find(base, "role")
	if role >= 0 && b[r.mem[role].v.s] == '"' {
		r.message(base, role)
	} else if responses {
		r.putByte(RS)
		typ := r.find(base, "type")
		if typ >= 0 && b[r.mem[typ].v.s] == '"' {
			r.text(r.mem[typ].v)
		} else {
			typ = -1
		}
		r.putByte(US)
		r.object(base, typ)
	}
	r.mem, r.kbuf = r.mem[:base], r.kbuf[:kb]
	return r.after(v.e)
}

// plainMessage renders the object v if it is the common message shape: only
// "role" (a string) and "content" members, keys unescaped. That needs no
// member collection or sorting; anything else returns false untouched.
func (r *Request) plainMessage(v val) bool {
	b := r.body
	var role, content val // e == 0: absent
	for k := r.first(v); k >= 0; {
		key := r.valAt(k)
		x := r.valAt(skipWS(b, skipWS(b, key.e)+1))
		switch string(b[k+1 : key.e-1]) {
		case "role":
			role = x
		case "content":
			content = x
		default:
			return false
		}
		k = r.after(x.e)
	}
	if role.e == 0 || b[role.s] != '"' {
		return false
	}
	r.putByte(RS)
	r.text(role)
	r.putByte(US)
	if content.e > 0 {
		r.content(content)
	}
	return true
}

// message writes RS role US content(content), then GS k US canon(v) for the
// other non-null members in key order.
func (r *Request) message(base, role int) {
	b := r.body
	r.putByte(RS)
	r.text(r.mem[role].v)
	r.putByte(US)
	content := r.find(base, "content")
	if content >= 0 {
		r.content(r.mem[content].v)
	}
	for j, n := base, len(r.mem); j < n; j++ {
		m := r.mem[j]
		if j == role || j == content || b[m.v.s] == 'n' || !r.winner(j, n) {
			continue
		}
		r.putByte(GS)
		r.put(r.key(&m))
		r.putByte(US)
		r.canon(m.v)
	}
}

// content writes content(v): a string as its text, an array as its parts
// separated by US (text parts as their text, others as canon), null as
// nothing, and any other value as canon.
func (r *Request) content(v val) {
	b := r.body
	switch b[v.s] {
	case '"':
		r.text(v)
	case 'n':
	case '[':
		for i := r.first(v); i >= 0; {
			p := r.valAt(i)
			r.part(p)
			if i = r.after(p.e); i >= 0 {
				r.putByte(US)
			}
		}
	default:
		r.canon(v)
	}
}

// part writes one content part.
func (r *Request) part(v val) {
	b := r.body
	if b[v.s] != '{' {
		r.canon(v)
		return
	}
	base, kb := len(r.mem), len(r.kbuf)
	r.collect(v)
	typ, txt := r.find(base, "type"), r.find(base, "text")
	if typ >= 0 && txt >= 0 && b[r.mem[typ].v.s] == '"' && b[r.mem[txt].v.s] == '"' {
		if t := r.mem[typ].v; r.strIs(t, "text") || r.strIs(t, "input_text") || r.strIs(t, "output_text") {
			r.text(r.mem[txt].v)
			r.mem, r.kbuf = r.mem[:base], r.kbuf[:kb]
			return
		}
	}
	r.object(base, -1)
	r.mem, r.kbuf = r.mem[:base], r.kbuf[:kb]
}

// promptValue writes prompt(v) for a value Parse accepted: text, texts joined
// by RS, token ids as 4-byte little-endian, or token lists joined by RS.
func (r *Request) promptValue(sp span) {
	b := r.body
	v := r.valAt(sp.s)
	if b[v.s] == '"' {
		r.text(v)
		return
	}
	for i := r.first(v); i >= 0; {
		e := r.valAt(i)
		switch b[i] {
		case '"':
			r.text(e)
		case '[':
			for j := r.first(e); j >= 0; j = r.next(j) {
				r.token(j)
			}
		default:
			r.token(i)
		}
		i = r.after(e.e)
		if i >= 0 && b[i] != '-' && !isDigit(b[i]) {
			r.putByte(RS)
		}
	}
}

func (r *Request) token(i int) {
	id, _ := tokenID(r.body, i)
	if r.n+4 > outCap {
		r.flush()
	}
	binary.LittleEndian.PutUint32(r.out[r.n:], id)
	r.n += 4
}
