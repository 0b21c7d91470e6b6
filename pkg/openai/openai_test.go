package openai

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

// bufSink collects the rendering.
type bufSink struct{ b []byte }

func (s *bufSink) Write(p []byte) { s.b = append(s.b, p...) }

// sep spells separators readably in expected renderings.
var sep = strings.NewReplacer("<RS>", "\x1e", "<US>", "\x1f", "<GS>", "\x1d")

// show makes renderings readable in failure messages.
var show = strings.NewReplacer("\x1e", "<RS>", "\x1f", "<US>", "\x1d", "<GS>")

func render(t *testing.T, api API, body string) string {
	t.Helper()
	var r Request
	if err := Parse(api, []byte(body), &r); err != nil {
		t.Fatalf("Parse(%s): %v\nbody: %s", api, err, body)
	}
	var s bufSink
	r.Render(&s)
	return string(s.b)
}

func parseErr(api API, body string) *Error {
	var r Request
	err := Parse(api, []byte(body), &r)
	if err == nil {
		return nil
	}
	var e *Error
	if !errors.As(err, &e) {
		panic("Parse returned a non-*Error: " + err.Error())
	}
	return e
}

func TestAPIForPathClassifiesBySuffix(t *testing.T) {
	for _, tc := range []struct {
		path string
		want API
	}{
		{"/v1/chat/completions", APIChatCompletions},
		{"/v1/completions", APICompletions},
		{"/v1/embeddings", APIEmbeddings},
		{"/v1/responses", APIResponses},
		{"/openai/v1/chat/completions", APIChatCompletions},
		{"/tenant-a/v1/completions", APICompletions},
		{"/v1/chat/completions/", APIChatCompletions},
		{"/v1/chat/completions?api-version=2024-10-21", APIChatCompletions},
		{"/v1/embeddings/?x=1", APIEmbeddings},
		{"/v1/responses#frag", APIResponses},
		{"/v1/models", APIOther},
		{"/v1/chat/completionsx", APIOther},
		{"/v2/chat/completions", APIOther},
		{"/xv1/completions", APIOther},
		{"v1/completions", APIOther},
		{"/v1/responses/resp_123", APIOther},
		{"/", APIOther},
		{"", APIOther},
		{"/health", APIOther},
	} {
		if got := APIForPath(tc.path); got != tc.want {
			t.Errorf("APIForPath(%q) = %v, want %v", tc.path, got, tc.want)
		}
	}
}

func TestAPIStringNamesEveryAPI(t *testing.T) {
	for a, want := range map[API]string{
		APIOther: "other", APIChatCompletions: "chat_completions", APICompletions: "completions",
		APIEmbeddings: "embeddings", APIResponses: "responses", API(200): "other",
	} {
		if got := a.String(); got != want {
			t.Errorf("API(%d).String() = %q, want %q", a, got, want)
		}
	}
}

// Pins the exact bytes of the rendering, one case per rule of
// docs/rendering.md.
func TestRenderMatchesSpec(t *testing.T) {
	for _, tc := range []struct {
		name string
		api  API
		body string
		want string
	}{
		{"chat: role and string content", APIChatCompletions,
			`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`,
			`<RS>system<US>be brief<RS>user<US>hi`},
		{"chat: tools first, as canon", APIChatCompletions,
			`{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}],"messages":[{"role":"user","content":"x"}]}`,
			`<RS>tools<US>[{"function":{"name":"f","parameters":{"properties":{},"type":"object"}},"type":"function"}]<RS>user<US>x`},
		{"chat: empty tools array is absent", APIChatCompletions,
			`{"model":"m","tools":[],"messages":[{"role":"user","content":"x"}]}`,
			`<RS>user<US>x`},
		{"chat: null tools is absent", APIChatCompletions,
			`{"model":"m","tools":null,"messages":[{"role":"user","content":"x"}]}`,
			`<RS>user<US>x`},
		{"chat: other message members in key order after content", APIChatCompletions,
			`{"model":"m","messages":[{"tool_call_id":"c1","role":"tool","name":"f","content":"42"}]}`,
			`<RS>tool<US>42<GS>name<US>"f"<GS>tool_call_id<US>"c1"`},
		{"chat: tool_calls as canon, null content renders empty", APIChatCompletions,
			`{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]}]}`,
			`<RS>assistant<US><GS>tool_calls<US>[{"function":{"arguments":"{"a":1}","name":"f"},"id":"c1","type":"function"}]`},
		{"chat: missing content renders empty", APIChatCompletions,
			`{"model":"m","messages":[{"role":"assistant"}]}`,
			`<RS>assistant<US>`},
		{"chat: content parts separated by US, non-text parts as canon", APIChatCompletions,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"https://x/y.png","detail":null}},{"type":"input_text","text":"and"},{"type":"output_text","text":"this"}]}]}`,
			`<RS>user<US>look<US>{"image_url":{"url":"https://x/y.png"},"type":"image_url"}<US>and<US>this`},
		{"chat: text part without string text renders as canon", APIChatCompletions,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":5},"raw"]}]}`,
			`<RS>user<US>{"text":5,"type":"text"}<US>"raw"`},
		{"chat: non-string non-array content renders as canon", APIChatCompletions,
			`{"model":"m","messages":[{"role":"user","content":{"b":[1,2.50,-3e+2,true,false,null],"a":"x"}}]}`,
			`<RS>user<US>{"a":"x","b":[1,2.50,-3e+2,true,false,null]}`},
		{"chat: null members dropped", APIChatCompletions,
			`{"model":"m","messages":[{"role":"user","content":"x","name":null}]}`,
			`<RS>user<US>x`},
		{"chat: duplicate keys, last wins", APIChatCompletions,
			`{"model":"m","messages":[{"role":"user","content":"first","role":"system","content":"second","x":{"k":1,"k":2}}]}`,
			`<RS>system<US>second<GS>x<US>{"k":2}`},
		{"chat: duplicate key whose last value is null is dropped", APIChatCompletions,
			`{"model":"m","messages":[{"role":"user","x":{"k":1,"k":null}}]}`,
			`<RS>user<US><GS>x<US>{}`},
		{"chat: escapes decoded", APIChatCompletions,
			`{"model":"m","messages":[{"role":"user","content":"a\"b\\c\/d\n\t\u00e9\ud83d\ude00\u0000"}]}`,
			"<RS>user<US>a\"b\\c/d\n\té😀\x00"},
		{"chat: lone surrogates decode to U+FFFD", APIChatCompletions,
			`{"model":"m","messages":[{"role":"user","content":"\ud800x\udc00\ud800\u0041"}]}`,
			"<RS>user<US>\uFFFDx\uFFFD\uFFFDA"},
		{"chat: invalid UTF-8 passes through", APIChatCompletions,
			"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\xffb\xc3\"}]}",
			"<RS>user<US>a\xffb\xc3"},
		{"completions: string prompt", APICompletions,
			`{"model":"m","prompt":"Once upon","max_tokens":5}`,
			`<RS>prompt<US>Once upon`},
		{"completions: array of strings joined by RS", APICompletions,
			`{"model":"m","prompt":["a","b\n","c"]}`,
			"<RS>prompt<US>a<RS>b\n<RS>c"},
		{"completions: empty array renders nothing", APICompletions,
			`{"model":"m","prompt":[]}`,
			`<RS>prompt<US>`},
		{"embeddings: input string", APIEmbeddings,
			`{"model":"m","input":"embed me","encoding_format":"float"}`,
			`<RS>input<US>embed me`},
		{"responses: string input is one user message", APIResponses,
			`{"model":"m","instructions":"be terse","input":"hi"}`,
			`<RS>instructions<US>be terse<RS>user<US>hi`},
		{"responses: tools, instructions, then items", APIResponses,
			`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"weather?"}]},{"type":"function_call","call_id":"c1","name":"w","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"sunny"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Sunny."}]}],"instructions":"sys","tools":[{"type":"function","name":"w"}]}`,
			`<RS>tools<US>[{"name":"w","type":"function"}]<RS>instructions<US>sys<RS>user<US>weather?` +
				`<RS>function_call<US>{"arguments":"{}","call_id":"c1","name":"w"}` +
				`<RS>function_call_output<US>{"call_id":"c1","output":"sunny"}` +
				`<RS>assistant<US>Sunny.<GS>type<US>"message"`},
		{"responses: item without string type or role", APIResponses,
			`{"model":"m","input":[{"id":"x"},{"type":7},"bare",{"role":3}]}`,
			`<RS><US>{"id":"x"}<RS><US>{"type":7}<RS><US>"bare"<RS><US>{"role":3}`},
		{"responses: null instructions absent", APIResponses,
			`{"model":"m","instructions":null,"input":"hi"}`,
			`<RS>user<US>hi`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := render(t, tc.api, tc.body)
			if want := sep.Replace(tc.want); got != want {
				t.Errorf("rendering\n got %s\nwant %s", show.Replace(got), show.Replace(want))
			}
		})
	}
}

func TestRenderInvariantUnderKeyOrderWhitespaceAndEscapes(t *testing.T) {
	for _, tc := range []struct {
		name string
		api  API
		a, b string
	}{
		{"key order at every level", APIChatCompletions,
			`{"model":"m","messages":[{"role":"user","content":"x","name":"n"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"a":1,"b":2}}}]}`,
			`{"tools":[{"function":{"parameters":{"b":2,"a":1},"name":"f"},"type":"function"}],"messages":[{"name":"n","content":"x","role":"user"}],"model":"m"}`},
		{"whitespace", APIChatCompletions,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`,
			" \n{ \"model\" : \"m\" ,\r\n\t\"messages\" : [ { \"role\" : \"user\" , \"content\" : [ { \"type\" : \"text\" , \"text\" : \"x\" } ] } ] } \n"},
		{"unicode escapes vs raw UTF-8", APIChatCompletions,
			`{"model":"m","messages":[{"role":"user","content":"caf\u00e9 \ud83d\ude00"}]}`,
			`{"model":"m","messages":[{"role":"user","content":"café 😀"}]}`},
		{"escaped solidus and hex case", APIChatCompletions,
			`{"model":"m","messages":[{"role":"user","content":"a\/b \u00E9"}]}`,
			`{"model":"m","messages":[{"role":"user","content":"a/b \u00e9"}]}`},
		{"escaped keys and type values", APIChatCompletions,
			`{"m\u006fdel":"m","messages":[{"r\u006fle":"user","c\u006fntent":[{"typ\u0065":"t\u0065xt","text":"x"}]}]}`,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`},
		{"escaped keys sort by decoded bytes", APIChatCompletions,
			`{"model":"m","messages":[{"role":"user","x":{"\u0062":1,"a":2,"\u0063":3}}]}`,
			`{"model":"m","messages":[{"role":"user","x":{"c":3,"b":1,"a":2}}]}`},
		{"null members anywhere", APIChatCompletions,
			`{"model":"m","messages":[{"role":"user","content":"x","name":null,"m":{"a":null,"b":1}}],"tools":null}`,
			`{"model":"m","messages":[{"role":"user","content":"x","m":{"b":1}}]}`},
		{"string content equals a single text part", APIChatCompletions,
			`{"model":"m","messages":[{"role":"user","content":"hello"}]}`,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hello"}]}]}`},
		{"input_text part equals string content", APIResponses,
			`{"model":"m","input":[{"role":"user","content":"hello"}]}`,
			`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"hello"}]}]}`},
		{"sampling parameters do not matter", APIChatCompletions,
			`{"model":"m","messages":[{"role":"user","content":"x"}]}`,
			`{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":0.2,"top_p":0.9,"max_tokens":100,"stream":true,"seed":7,"n":2,"stop":["\n"],"logit_bias":{"50256":-100},"stream_options":{"include_usage":true},"user":"u1","cache_salt":"s"}`},
		{"model and cache_salt are not in the rendering", APICompletions,
			`{"model":"a","prompt":"p"}`,
			`{"model":"b","prompt":"p","cache_salt":"t1"}`},
		{"duplicate top-level keys: last wins", APIChatCompletions,
			`{"model":"m","messages":[{"role":"user","content":"old"}],"messages":[{"role":"user","content":"new"}]}`,
			`{"model":"m","messages":[{"role":"user","content":"new"}]}`},
		{"string prompt equals one-element array", APIEmbeddings,
			`{"model":"m","input":"x"}`,
			`{"model":"m","input":["x"]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := render(t, tc.api, tc.a), render(t, tc.api, tc.b)
			if a != b {
				t.Errorf("renderings differ\n a %s\n b %s", show.Replace(a), show.Replace(b))
			}
		})
	}
}

func TestRenderDistinguishesWhatReachesThePrompt(t *testing.T) {
	base := `{"model":"m","messages":[{"role":"user","content":"x"}]}`
	for _, tc := range []struct{ name, body string }{
		{"tool definitions", `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}`},
		{"role", `{"model":"m","messages":[{"role":"system","content":"x"}]}`},
		{"content", `{"model":"m","messages":[{"role":"user","content":"y"}]}`},
		{"name", `{"model":"m","messages":[{"role":"user","content":"x","name":"bob"}]}`},
		{"extra message", `{"model":"m","messages":[{"role":"user","content":"x"},{"role":"user","content":""}]}`},
		{"content split into parts", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":""},{"type":"text","text":"x"}]}]}`},
		{"image part", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"},{"type":"image_url","image_url":{"url":"u"}}]}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if a, b := render(t, APIChatCompletions, base), render(t, APIChatCompletions, tc.body); a == b {
				t.Errorf("%s did not change the rendering: %s", tc.name, show.Replace(a))
			}
		})
	}
	t.Run("tool definitions in responses", func(t *testing.T) {
		a := render(t, APIResponses, `{"model":"m","input":"x"}`)
		b := render(t, APIResponses, `{"model":"m","input":"x","tools":[{"type":"web_search"}]}`)
		if a == b {
			t.Error("tools did not change the responses rendering")
		}
	})
	t.Run("number spelling is kept", func(t *testing.T) {
		a := render(t, APIChatCompletions, `{"model":"m","messages":[{"role":"user","x":1}]}`)
		b := render(t, APIChatCompletions, `{"model":"m","messages":[{"role":"user","x":1.0}]}`)
		if a == b {
			t.Error("1 and 1.0 render alike; canon() keeps numbers as written")
		}
	})
}

func TestRenderOfEarlierTurnIsPrefixOfLaterTurn(t *testing.T) {
	chatTurns := []string{
		`{"role":"system","content":"You are helpful.\nBe brief."}`,
		`{"role":"user","content":"What is 2+2?"}`,
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"calc","arguments":"{\"e\":\"2+2\"}"}}]}`,
		`{"role":"tool","tool_call_id":"c1","content":"4"}`,
		`{"role":"assistant","content":"4"}`,
		`{"role":"user","content":[{"type":"text","text":"And this?"},{"type":"image_url","image_url":{"url":"data:..."}}]}`,
	}
	tools := `[{"type":"function","function":{"name":"calc","parameters":{"type":"object"}}}]`
	var prev string
	for n := 1; n <= len(chatTurns); n++ {
		body := `{"model":"m","temperature":0.1,"tools":` + tools + `,"messages":[` + strings.Join(chatTurns[:n], ",") + `]}`
		got := render(t, APIChatCompletions, body)
		if !strings.HasPrefix(got, prev) || len(got) <= len(prev) {
			t.Fatalf("chat turn %d: rendering is not a strict extension of turn %d\nprev %s\n got %s", n, n-1, show.Replace(prev), show.Replace(got))
		}
		prev = got
	}

	respTurns := []string{
		`{"role":"user","content":"weather in Paris?"}`,
		`{"type":"function_call","call_id":"c1","name":"weather","arguments":"{\"city\":\"Paris\"}"}`,
		`{"type":"function_call_output","call_id":"c1","output":"{\"t\":21}"}`,
		`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"21°C"}]}`,
		`{"role":"user","content":[{"type":"input_text","text":"and tomorrow?"}]}`,
	}
	prev = ""
	for n := 1; n <= len(respTurns); n++ {
		body := `{"model":"m","instructions":"Use tools.","tools":[{"type":"function","name":"weather"}],"input":[` + strings.Join(respTurns[:n], ",") + `]}`
		got := render(t, APIResponses, body)
		if !strings.HasPrefix(got, prev) || len(got) <= len(prev) {
			t.Fatalf("responses turn %d: rendering is not a strict extension of turn %d\nprev %s\n got %s", n, n-1, show.Replace(prev), show.Replace(got))
		}
		prev = got
	}
}

func TestRenderTokenIDsAsLittleEndianUint32(t *testing.T) {
	le := func(ids ...uint32) string {
		var b []byte
		for _, id := range ids {
			b = binary.LittleEndian.AppendUint32(b, id)
		}
		return string(b)
	}
	for _, tc := range []struct {
		name string
		api  API
		body string
		want string
	}{
		{"token ids", APICompletions, `{"model":"m","prompt":[1,258,65536,4294967295,0]}`,
			"\x1eprompt\x1f" + le(1, 258, 65536, 4294967295, 0)},
		{"arrays of token ids joined by RS", APICompletions, `{"model":"m","prompt":[[1,2],[],[3]]}`,
			"\x1eprompt\x1f" + le(1, 2) + "\x1e\x1e" + le(3)},
		{"embeddings token ids", APIEmbeddings, `{"model":"m","input":[ 7 , 8 ]}`,
			"\x1einput\x1f" + le(7, 8)},
		{"sixteen tokens fill one 64-byte block", APICompletions,
			`{"model":"m","prompt":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]}`,
			"\x1eprompt\x1f" + le(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := render(t, tc.api, tc.body); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	deep := func(n int) string {
		return `{"model":"m","messages":[{"role":"user","x":` + strings.Repeat("[", n) + strings.Repeat("]", n) + `}]}`
	}
	for _, tc := range []struct {
		name        string
		api         API
		body        string
		param, code string
	}{
		{"empty body", APIChatCompletions, ``, "", CodeInvalidJSON},
		{"whitespace only", APIChatCompletions, " \n", "", CodeInvalidJSON},
		{"truncated", APIChatCompletions, `{"model":"m","messages":[{"role":"user"`, "", CodeInvalidJSON},
		{"trailing comma", APIChatCompletions, `{"model":"m","messages":[{"role":"user"}],}`, "", CodeInvalidJSON},
		{"trailing garbage", APIChatCompletions, `{"model":"m","messages":[{"role":"user"}]} x`, "", CodeInvalidJSON},
		{"two documents", APIChatCompletions, `{"model":"m","messages":[{"role":"user"}]}{}`, "", CodeInvalidJSON},
		{"raw newline in string", APIChatCompletions, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\nb\"}]}", "", CodeInvalidJSON},
		{"raw tab in key", APIChatCompletions, "{\"mo\tdel\":\"m\"}", "", CodeInvalidJSON},
		{"bad escape", APIChatCompletions, `{"model":"m\x","messages":[]}`, "", CodeInvalidJSON},
		{"short unicode escape", APIChatCompletions, `{"model":"\u12","messages":[]}`, "", CodeInvalidJSON},
		{"leading zero", APICompletions, `{"model":"m","prompt":[01]}`, "", CodeInvalidJSON},
		{"bare minus", APICompletions, `{"model":"m","prompt":[-]}`, "", CodeInvalidJSON},
		{"dot without digits", APICompletions, `{"model":"m","prompt":[1.]}`, "", CodeInvalidJSON},
		{"exponent without digits", APICompletions, `{"model":"m","prompt":[1e+]}`, "", CodeInvalidJSON},
		{"bad literal", APIChatCompletions, `{"model":"m","stream":tru}`, "", CodeInvalidJSON},
		{"single quotes", APIChatCompletions, `{'model':'m'}`, "", CodeInvalidJSON},
		{"unquoted key", APIChatCompletions, `{model:"m"}`, "", CodeInvalidJSON},
		{"missing colon", APIChatCompletions, `{"model" "m"}`, "", CodeInvalidJSON},
		{"NaN", APIChatCompletions, `{"model":"m","temperature":NaN}`, "", CodeInvalidJSON},
		{"invalid JSON in a skipped member", APIChatCompletions, `{"model":"m","messages":[{"role":"user"}],"x":[1,]}`, "", CodeInvalidJSON},
		{"top level array", APIChatCompletions, `[{"model":"m"}]`, "", CodeInvalidType},
		{"top level string", APIChatCompletions, `"x"`, "", CodeInvalidType},
		{"top level null", APIChatCompletions, `null`, "", CodeInvalidType},
		{"model missing", APIChatCompletions, `{"messages":[{"role":"user"}]}`, "model", CodeMissingModel},
		{"model null", APIChatCompletions, `{"model":null,"messages":[{"role":"user"}]}`, "model", CodeMissingModel},
		{"model empty", APIChatCompletions, `{"model":"","messages":[{"role":"user"}]}`, "model", CodeMissingModel},
		{"model not a string", APIChatCompletions, `{"model":5,"messages":[{"role":"user"}]}`, "model", CodeInvalidType},
		{"messages missing", APIChatCompletions, `{"model":"m"}`, "messages", CodeMissingMessage},
		{"messages null", APIChatCompletions, `{"model":"m","messages":null}`, "messages", CodeMissingMessage},
		{"messages not an array", APIChatCompletions, `{"model":"m","messages":{"role":"user"}}`, "messages", CodeInvalidType},
		{"messages empty", APIChatCompletions, `{"model":"m","messages":[]}`, "messages", CodeInvalidValue},
		{"message not an object", APIChatCompletions, `{"model":"m","messages":[{"role":"user"},"hi"]}`, "messages", CodeInvalidType},
		{"message without role", APIChatCompletions, `{"model":"m","messages":[{"content":"hi"}]}`, "messages", CodeMissingRole},
		{"message with null role", APIChatCompletions, `{"model":"m","messages":[{"role":null}]}`, "messages", CodeMissingRole},
		{"message with non-string role", APIChatCompletions, `{"model":"m","messages":[{"role":["user"]}]}`, "messages", CodeInvalidType},
		{"chat tools not an array", APIChatCompletions, `{"model":"m","messages":[{"role":"user"}],"tools":{}}`, "tools", CodeInvalidType},
		{"cache_salt not a string", APIChatCompletions, `{"model":"m","messages":[{"role":"user"}],"cache_salt":1}`, "cache_salt", CodeInvalidType},
		{"stream not a bool", APIChatCompletions, `{"model":"m","messages":[{"role":"user"}],"stream":"yes"}`, "stream", CodeInvalidType},
		{"prompt missing", APICompletions, `{"model":"m"}`, "prompt", CodeMissingPrompt},
		{"prompt null", APICompletions, `{"model":"m","prompt":null}`, "prompt", CodeMissingPrompt},
		{"prompt object", APICompletions, `{"model":"m","prompt":{}}`, "prompt", CodeInvalidType},
		{"prompt number", APICompletions, `{"model":"m","prompt":5}`, "prompt", CodeInvalidType},
		{"prompt mixed strings and tokens", APICompletions, `{"model":"m","prompt":["a",1]}`, "prompt", CodeInvalidType},
		{"prompt mixed tokens and lists", APICompletions, `{"model":"m","prompt":[1,[2]]}`, "prompt", CodeInvalidType},
		{"prompt array of bools", APICompletions, `{"model":"m","prompt":[true]}`, "prompt", CodeInvalidType},
		{"prompt nested strings", APICompletions, `{"model":"m","prompt":[["a"]]}`, "prompt", CodeInvalidType},
		{"prompt three levels", APICompletions, `{"model":"m","prompt":[[[1]]]}`, "prompt", CodeInvalidType},
		{"token id negative", APICompletions, `{"model":"m","prompt":[1,-1]}`, "prompt", CodeInvalidValue},
		{"token id too large", APICompletions, `{"model":"m","prompt":[4294967296]}`, "prompt", CodeInvalidValue},
		{"token id huge", APICompletions, `{"model":"m","prompt":[99999999999999999999999]}`, "prompt", CodeInvalidValue},
		{"token id fraction", APICompletions, `{"model":"m","prompt":[[1.5]]}`, "prompt", CodeInvalidValue},
		{"token id exponent", APICompletions, `{"model":"m","prompt":[1e3]}`, "prompt", CodeInvalidValue},
		{"embeddings input missing", APIEmbeddings, `{"model":"m"}`, "input", CodeMissingInput},
		{"embeddings input wrong type", APIEmbeddings, `{"model":"m","input":true}`, "input", CodeInvalidType},
		{"embeddings token too large", APIEmbeddings, `{"model":"m","input":[[5000000000]]}`, "input", CodeInvalidValue},
		{"responses input missing", APIResponses, `{"model":"m"}`, "input", CodeMissingInput},
		{"responses input object", APIResponses, `{"model":"m","input":{"role":"user"}}`, "input", CodeInvalidType},
		{"responses instructions not a string", APIResponses, `{"model":"m","input":"x","instructions":["a"]}`, "instructions", CodeInvalidType},
		{"responses tools not an array", APIResponses, `{"model":"m","input":"x","tools":"web"}`, "tools", CodeInvalidType},
		{"nesting deeper than 128", APIChatCompletions, deep(MaxDepth - 2), "", CodeTooDeep},
		{"hostile nesting", APIChatCompletions, strings.Repeat("[", 1<<20), "", CodeTooDeep},
		{"hostile object nesting", APIChatCompletions, strings.Repeat(`{"a":`, 1<<16), "", CodeTooDeep},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := parseErr(tc.api, tc.body)
			if e == nil {
				t.Fatalf("Parse accepted %q", tc.body)
			}
			if e.Param != tc.param || e.Code != tc.code {
				t.Errorf("got Param %q Code %q (%q), want Param %q Code %q", e.Param, e.Code, e.Message, tc.param, tc.code)
			}
			if e.Status != 400 || e.Type != "invalid_request_error" || e.Message == "" || e.Error() != e.Message {
				t.Errorf("malformed error %+v", e)
			}
		})
	}
}

func TestParseErrorMessagesAreSpecific(t *testing.T) {
	for _, tc := range []struct {
		body, want string
	}{
		{`{"model":"m","messages":[{"role":"user"}`, "invalid JSON at byte 40: unexpected end of input"},
		{`{"model":"m",}`, `invalid JSON at byte 13: invalid character '}' looking for beginning of object key string`},
		{"{\"model\":\"a\x01\"}", "invalid JSON at byte 11: invalid control character 0x01 in string literal"},
		{`{"messages":[{"role":"user"}]}`, `"model" is required`},
		{`{"model":"m","messages":[]}`, `"messages" must be a non-empty array`},
		{`{"model":"m","messages":[{"role":"user"},{"content":"x"}]}`, `"messages[1].role" is required`},
		{`{"model":"m","messages":[{"role":"user"},1]}`, `"messages[1]" must be an object`},
	} {
		if e := parseErr(APIChatCompletions, tc.body); e == nil || e.Message != tc.want {
			t.Errorf("Parse(%q) = %v, want %q", tc.body, e, tc.want)
		}
	}
	if e := parseErr(APICompletions, `{"model":"m","prompt":[-1]}`); e == nil || !strings.Contains(e.Message, "token ids must be integers in [0, 2^32)") {
		t.Errorf("token id error = %v", e)
	}
}

func TestParseAcceptsNestingUpToTheLimit(t *testing.T) {
	// The top-level object and "messages", a message and "x" take 3 levels.
	n := MaxDepth - 3
	body := `{"model":"m","messages":[{"role":"user","x":` + strings.Repeat("[", n) + strings.Repeat("]", n) + `}]}`
	got := render(t, APIChatCompletions, body)
	if want := "\x1euser\x1f\x1dx\x1f" + strings.Repeat("[", n) + strings.Repeat("]", n); got != want {
		t.Errorf("got %q", got)
	}
	n++
	deeper := `{"model":"m","messages":[{"role":"user","x":` + strings.Repeat("[", n) + strings.Repeat("]", n) + `}]}`
	if e := parseErr(APIChatCompletions, deeper); e == nil || e.Code != CodeTooDeep {
		t.Errorf("one more level: %v", e)
	}
}

func TestParseRecordsModelSaltStream(t *testing.T) {
	var r Request
	body := `{"model":"meta-llama/Llama-3.1-8B","cache_salt":"tenant-\u0041","stream":true,"messages":[{"role":"user"}]}`
	if err := Parse(APIChatCompletions, []byte(body), &r); err != nil {
		t.Fatal(err)
	}
	if r.API != APIChatCompletions || r.Model != "meta-llama/Llama-3.1-8B" || r.CacheSalt != "tenant-A" || !r.Stream {
		t.Errorf("got %+v", r)
	}
	// The strings survive reuse of the body.
	model := r.Model
	b := []byte(body)
	if err := Parse(APIChatCompletions, b, &r); err != nil {
		t.Fatal(err)
	}
	copy(b, bytes.Repeat([]byte("x"), len(b)))
	if r.Model != "meta-llama/Llama-3.1-8B" || model != r.Model || r.CacheSalt != "tenant-A" {
		t.Errorf("Model/CacheSalt alias the body: %q %q", r.Model, r.CacheSalt)
	}
	if err := Parse(APIChatCompletions, []byte(`{"model":"m","stream":null,"cache_salt":null,"messages":[{"role":"u"}]}`), &r); err != nil {
		t.Fatal(err)
	}
	if r.Model != "m" || r.CacheSalt != "" || r.Stream {
		t.Errorf("fields not reset: %+v", r)
	}
}

func TestRequestReuseAndReset(t *testing.T) {
	var r Request
	var s bufSink
	bodies := []struct {
		api  API
		body string
	}{
		{APIChatCompletions, `{"model":"a","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"x\ny","k":{"b":1,"a":2}}]}`},
		{APICompletions, `{"model":"b","prompt":[[1,2],[3]]}`},
		{APIResponses, `{"model":"c","input":[{"type":"x","z":1,"a":[{"q":1,"p":2}]}]}`},
		{APIEmbeddings, `{"model":"d","input":["a\"b","c"]}`},
	}
	for round := 0; round < 3; round++ {
		for _, tc := range bodies {
			want := render(t, tc.api, tc.body)
			if err := Parse(tc.api, []byte(tc.body), &r); err != nil {
				t.Fatal(err)
			}
			s.b = s.b[:0]
			r.Render(&s)
			if string(s.b) != want {
				t.Fatalf("reused Request renders %q, fresh one %q", s.b, want)
			}
		}
	}
	r.Reset()
	s.b = s.b[:0]
	r.Render(&s)
	if len(s.b) != 0 || r.Model != "" || r.body != nil {
		t.Errorf("after Reset: rendered %q, model %q", s.b, r.Model)
	}
	// A failed Parse leaves nothing to render.
	if Parse(APIChatCompletions, []byte(`{"model":"m"}`), &r) == nil {
		t.Fatal("accepted")
	}
	r.Render(&s)
	if len(s.b) != 0 {
		t.Errorf("render after failed parse wrote %q", s.b)
	}
}

func TestRenderIgnoresChangesToExportedAPI(t *testing.T) {
	var r Request
	if err := Parse(APIChatCompletions, []byte(`{"model":"m","messages":[{"role":"user","content":"x"}]}`), &r); err != nil {
		t.Fatal(err)
	}
	r.API = APICompletions
	var s bufSink
	r.Render(&s)
	if string(s.b) != "\x1euser\x1fx" {
		t.Errorf("got %q", s.b)
	}
}

func TestParseOtherAPIIgnoresBody(t *testing.T) {
	var r Request
	if err := Parse(APIOther, []byte("not json"), &r); err != nil {
		t.Fatal(err)
	}
	var s bufSink
	r.Render(&s)
	if len(s.b) != 0 || r.API != APIOther {
		t.Errorf("APIOther rendered %q", s.b)
	}
}

// Long strings straddle the scratch buffer and the direct-write threshold;
// the rendering must not depend on how it is chunked.
func TestRenderLongAndEscapeDenseStrings(t *testing.T) {
	for _, n := range []int{0, 1, 15, 16, 17, 255, 256, 257, 2047, 2048, 2049, 5000, 70000} {
		for _, unit := range []string{"a", `\n`, `ab\"`, `\u00e9xyz`, "é", `\\\\`, strings.Repeat("x", 300) + `\t`} {
			raw := strings.Repeat(unit, n/len(unit)+1)
			body := `{"model":"m","messages":[{"role":"user","content":"` + raw + `"},{"role":"user","content":["` + raw + `"]}]}`
			var want string
			if err := jsonUnquote(`"`+raw+`"`, &want); err != nil {
				t.Fatal(err)
			}
			got := render(t, APIChatCompletions, body)
			exp := "\x1euser\x1f" + want + "\x1euser\x1f\"" + want + "\""
			if got != exp {
				t.Fatalf("n=%d unit=%q: rendering differs (len %d vs %d)", n, unit, len(got), len(exp))
			}
		}
	}
}

// countingSink counts bytes without keeping them, for allocation tests.
type countingSink struct{ n int }

func (c *countingSink) Write(p []byte) { c.n += len(p) }

func TestParseRenderDoNotAllocateWhenReused(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts are noisy under -short runs with coverage")
	}
	for _, tc := range []struct {
		api  API
		body []byte
	}{
		{APIChatCompletions, chatBody(64 << 10)},
		{APICompletions, []byte(`{"model":"m","prompt":[[1,2,3],[4,5]],"cache_salt":"s"}`)},
		{APIResponses, []byte(`{"model":"m","instructions":"x","input":[{"role":"user","content":"a\u00e9"},{"type":"function_call","b":1,"a":{"d":1,"c":2}}]}`)},
		{APIChatCompletions, []byte(`{"model":"m","messages":[{"r\u006fle":"user","content":[{"type":"text","text":"x"}],"name":"n"}],"tools":[{"p":{` +
			`"k01":1,"k20":2,"k03":3,"k19":4,"k05":5,"k18":6,"k07":7,"k17":8,"k09":9,"k16":10,"k11":11,"k15":12,"k13":13,"k14":14,"k12":15,"k10":16,"k08":17,"k06":18,"\u006b04":19,"k02":20}}]}`)},
	} {
		var r Request
		var s countingSink
		allocs := testing.AllocsPerRun(50, func() {
			if err := Parse(tc.api, tc.body, &r); err != nil {
				t.Fatal(err)
			}
			r.Render(&s)
		})
		if allocs != 0 {
			t.Errorf("%s: %.1f allocs per Parse+Render, want 0", tc.api, allocs)
		}
	}
}

// The scanner handles stop bytes in 64-byte windows and the body's last
// bytes one at a time; escapes must decode the same at every offset, across
// window edges and in the tail.
func TestEscapesDecodeAtEveryOffset(t *testing.T) {
	for _, esc := range []string{`\n`, `\"`, `\\`, `\/`, `\u00e9`, `\ud83d\ude00`, `\ud800`} {
		for off := 0; off < 140; off++ {
			for _, pad := range []string{"", "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"} {
				raw := strings.Repeat("a", off) + esc + "b"
				body := `{"model":"m","messages":[{"role":"user","content":"` + raw + `"}],"p":"` + pad + `"}`
				var want string
				if err := jsonUnquote(`"`+raw+`"`, &want); err != nil {
					t.Fatal(err)
				}
				if got := render(t, APIChatCompletions, body); got != "\x1euser\x1f"+want {
					t.Fatalf("esc %s at %d (pad %d): got %q want %q", esc, off, len(pad), got, want)
				}
			}
		}
	}
}
