package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// jsonUnquote decodes a JSON string literal with encoding/json.
func jsonUnquote(lit string, out *string) error { return json.Unmarshal([]byte(lit), out) }

// refCanon is canon() from docs/rendering.md written over encoding/json's
// decoded values (UseNumber keeps numbers as written): the reference the
// byte-level renderer is checked against.
func refCanon(sb *strings.Builder, v any) {
	switch v := v.(type) {
	case nil:
		sb.WriteString("null")
	case bool:
		fmt.Fprint(sb, v)
	case json.Number:
		sb.WriteString(string(v))
	case string:
		sb.WriteString(`"` + v + `"`)
	case []any:
		sb.WriteByte('[')
		for i, x := range v {
			if i > 0 {
				sb.WriteByte(',')
			}
			refCanon(sb, x)
		}
		sb.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k, x := range v {
			if x != nil {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		sb.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				sb.WriteByte(',')
			}
			sb.WriteString(`"` + k + `":`)
			refCanon(sb, v[k])
		}
		sb.WriteByte('}')
	default:
		panic(fmt.Sprintf("unexpected %T", v))
	}
}

func decodeNumber(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

// randString mixes ASCII, characters JSON must escape, characters
// encoding/json escapes by choice (<, >, &, U+2028) and multi-byte runes.
func randString(rng *rand.Rand) string {
	const pool = "ab \"\\/\n\t\r\b\f\x00\x01\x1f<>&\u2028\u2029é東😀\u007f\uFFFD"
	runes := []rune(pool)
	n := rng.IntN(12)
	if rng.IntN(10) == 0 {
		n = 100 + rng.IntN(400)
	}
	var sb strings.Builder
	for range n {
		sb.WriteRune(runes[rng.IntN(len(runes))])
	}
	return sb.String()
}

func randValue(rng *rand.Rand, depth int) any {
	k := rng.IntN(8)
	if depth > 5 {
		k = rng.IntN(5)
	}
	switch k {
	case 0:
		return nil
	case 1:
		return rng.IntN(2) == 0
	case 2:
		switch rng.IntN(4) {
		case 0:
			return float64(rng.IntN(1000) - 500)
		case 1:
			return rng.NormFloat64() * math.Pow(10, float64(rng.IntN(60)-30))
		case 2:
			return uint64(rng.Uint64())
		default:
			return json.Number("-0.5e+7")
		}
	case 3, 4:
		return randString(rng)
	case 5:
		a := make([]any, rng.IntN(5))
		for i := range a {
			a[i] = randValue(rng, depth+1)
		}
		return a
	default:
		m := map[string]any{}
		for range rng.IntN(6) {
			m[randString(rng)] = randValue(rng, depth+1)
		}
		return m
	}
}

// marshalVariants encodes v three ways: compact with HTML escaping, compact
// without, and indented.
func marshalVariants(t testing.TB, v any) [][]byte {
	a, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	c, err := json.MarshalIndent(v, " ", "\t")
	if err != nil {
		t.Fatal(err)
	}
	return [][]byte{a, b.Bytes(), c}
}

// syntaxOK reports whether Parse judged body to be valid JSON; ok is false
// when Parse could not tell (nesting limit).
func syntaxOK(api API, body []byte, r *Request) (valid, ok bool) {
	err := Parse(api, body, r)
	if err == nil {
		return true, true
	}
	var e *Error
	if !errors.As(err, &e) {
		panic("non-*Error from Parse: " + err.Error())
	}
	switch e.Code {
	case CodeTooDeep:
		return false, false
	case CodeInvalidJSON:
		return false, true
	}
	return true, true
}

// Random documents from encoding/json must be accepted, and their canon()
// must match the reference built on encoding/json's own decoding.
func TestDifferentialAgainstEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	var r Request
	var s bufSink
	n := 3000
	if testing.Short() {
		n = 300
	}
	for i := 0; i < n; i++ {
		v := randValue(rng, 0)
		for _, enc := range marshalVariants(t, v) {
			// As a top-level document: valid JSON, so never invalid_json.
			if valid, ok := syntaxOK(APIChatCompletions, enc, &r); ok && !valid {
				t.Fatalf("rejected valid JSON %s: %v", enc, Parse(APIChatCompletions, enc, &r))
			}
			// As a message member: rendered as canon.
			body := append([]byte(`{"model":"m","messages":[{"role":"user","content":"x","meta":`), enc...)
			body = append(body, "}]}"...)
			if err := Parse(APIChatCompletions, body, &r); err != nil {
				t.Fatalf("Parse(%s): %v", body, err)
			}
			s.b = s.b[:0]
			r.Render(&s)
			dv, err := decodeNumber(enc)
			if err != nil {
				t.Fatal(err)
			}
			var want strings.Builder
			want.WriteString("\x1euser\x1fx")
			if dv != nil {
				want.WriteString("\x1dmeta\x1f")
				refCanon(&want, dv)
			}
			if string(s.b) != want.String() {
				t.Fatalf("canon mismatch for %s\n got %q\nwant %q", enc, s.b, want.String())
			}
		}
	}
}

// Corrupted documents: Parse must agree with json.Valid on validity.
func TestDifferentialCorruptions(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	var r Request
	seeds := [][]byte{chatBody(4 << 10)}
	for range 200 {
		v := map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": randValue(rng, 2)}}, "x": randValue(rng, 0)}
		seeds = append(seeds, marshalVariants(t, v)...)
	}
	const structural = "{}[]:,\"\\ \n0123456789.eE+-tfnlrsu\x00\x1f\x7f\xff"
	n := 0
	for _, seed := range seeds {
		for range 40 {
			b := slices.Clone(seed)
			switch rng.IntN(4) {
			case 0:
				b = b[:rng.IntN(len(b)+1)]
			case 1:
				b[rng.IntN(len(b))] = byte(rng.IntN(256))
			case 2:
				b[rng.IntN(len(b))] = structural[rng.IntN(len(structural))]
			default:
				i := rng.IntN(len(b))
				b = slices.Insert(b, i, structural[rng.IntN(len(structural))])
			}
			valid, ok := syntaxOK(APIChatCompletions, b, &r)
			if !ok {
				continue
			}
			n++
			if want := json.Valid(b); valid != want {
				t.Fatalf("Parse says valid=%v, json.Valid says %v for %q (%v)", valid, want, b, Parse(APIChatCompletions, b, &r))
			}
			if valid {
				var s bufSink
				r.Render(&s) // must not panic
			}
		}
	}
	if n < 1000 {
		t.Fatalf("only %d corruptions checked", n)
	}
}

// checkAgainstEncodingJSON is the fuzz oracle: validity agrees with
// json.Valid; an accepted body renders deterministically; and re-encoding
// it with encoding/json (which sorts keys, drops whitespace and changes
// escapes) does not change the rendering.
func checkAgainstEncodingJSON(t *testing.T, data []byte) {
	var r Request
	for _, api := range []API{APIChatCompletions, APICompletions, APIEmbeddings, APIResponses} {
		valid, ok := syntaxOK(api, data, &r)
		if !ok {
			continue
		}
		if want := json.Valid(data); valid != want {
			t.Fatalf("%s: Parse valid=%v, json.Valid=%v", api, valid, want)
		}
		if Parse(api, data, &r) != nil {
			continue
		}
		var a, b bufSink
		r.Render(&a)
		r.Render(&b)
		if !bytes.Equal(a.b, b.b) {
			t.Fatalf("%s: two renderings differ", api)
		}
		if !utf8.Valid(data) {
			continue // encoding/json would replace invalid UTF-8
		}
		v, err := decodeNumber(data)
		if err != nil {
			t.Fatalf("encoding/json cannot decode an accepted body: %v", err)
		}
		re, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var r2 Request
		if err := Parse(api, re, &r2); err != nil {
			t.Fatalf("%s: re-encoded body rejected: %v\n%s", api, err, re)
		}
		var c bufSink
		r2.Render(&c)
		if !bytes.Equal(a.b, c.b) {
			t.Fatalf("%s: re-encoding changed the rendering\n orig %q\n  re %q\nbody %s\nre   %s", api, a.b, c.b, data, re)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"system","content":"be \"brief\"\n"},{"role":"user","content":[{"type":"text","text":"hi \u00e9"},{"type":"image_url","image_url":{"url":"data:x"}}]}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"string"}}}}}],"temperature":0.7,"stream":true}`,
		`{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"1"}]}`,
		`{"model":"m","prompt":"Once upon a time","max_tokens":10}`,
		`{"model":"m","prompt":[[1,2,3],[4294967295]],"cache_salt":"s"}`,
		`{"model":"m","prompt":["a","b"]}`,
		`{"model":"m","input":[1,2,3]}`,
		`{"model":"m","input":"embed \ud83d\ude00"}`,
		`{"model":"m","instructions":"x","input":[{"role":"user","content":"hi"},{"type":"function_call","name":"f","arguments":"{}"},{"type":"function_call_output","output":"ok"}],"tools":[{"type":"web_search"}]}`,
		`{"model":"m","input":"x","m\u006fdel":"n","x":[1,-2.5e+3,true,false,null,{}]}`,
		`[1,2]`, `""`, `{}`, `{"a":}`, "{\"model\":\"m\x01\"}",
	} {
		f.Add([]byte(s))
	}
	f.Add(chatBody(2 << 10))
	// Escapes straddling the scanner's 64-byte window edges.
	for off := 56; off < 72; off += 3 {
		f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", off) + `\ud83d\ude00\"x"}]}`))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkAgainstEncodingJSON(t, data)
	})
}
