// Package openai parses OpenAI-style request bodies and renders the part of
// them that reaches the model's prompt into a canonical byte stream (see
// docs/rendering.md). The picker hashes that stream in 64-byte blocks for
// prefix-cache-aware routing, so this package sits on the hot path of every
// request: it validates the body in one pass without encoding/json, keeps
// only byte spans into the body, and renders from those spans without
// allocating.
package openai

import (
	"math"
	"strings"
)

// API says which OpenAI endpoint a request targets; it decides which members
// are required and how the body renders.
type API uint8

const (
	APIOther API = iota // routed by load alone, body not parsed
	APIChatCompletions
	APICompletions
	APIEmbeddings
	APIResponses
)

// String returns a short, metric-label-friendly name.
func (a API) String() string {
	switch a {
	case APIChatCompletions:
		return "chat_completions"
	case APICompletions:
		return "completions"
	case APIEmbeddings:
		return "embeddings"
	case APIResponses:
		return "responses"
	}
	return "other"
}

// APIForPath classifies an HTTP :path. The query string (and a fragment) is
// ignored and the match is on the path suffix, so gateway prefixes such as
// "/openai/v1/chat/completions" still match; one trailing "/" is tolerated.
func APIForPath(path string) API {
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	path = strings.TrimSuffix(path, "/")
	switch {
	case strings.HasSuffix(path, "/v1/chat/completions"):
		return APIChatCompletions
	case strings.HasSuffix(path, "/v1/completions"):
		return APICompletions
	case strings.HasSuffix(path, "/v1/embeddings"):
		return APIEmbeddings
	case strings.HasSuffix(path, "/v1/responses"):
		return APIResponses
	}
	return APIOther
}

// Sink receives the rendering. The prefix hasher implements it. p is only
// valid during the call: it may point into the request body or into a
// scratch buffer that is overwritten by the next call.
type Sink interface{ Write(p []byte) }

// Error is a client error in OpenAI's error shape, so the ext_proc server can
// answer it directly with an immediate response.
type Error struct {
	Status  int    // HTTP status; always 400 here
	Type    string // "invalid_request_error"
	Param   string // offending top-level member, e.g. "messages"; "" for the body itself
	Code    string // machine-readable, e.g. "invalid_json", "missing_model", "invalid_type"
	Message string // human-readable
}

// Error returns the human-readable message.
func (e *Error) Error() string { return e.Message }

// Error codes returned in Error.Code.
const (
	CodeInvalidJSON    = "invalid_json"     // body is not RFC 8259 JSON
	CodeTooDeep        = "nesting_too_deep" // valid JSON nested deeper than MaxDepth
	CodeTooLarge       = "body_too_large"   // body longer than math.MaxInt32 bytes
	CodeInvalidType    = "invalid_type"     // a member has the wrong JSON type
	CodeInvalidValue   = "invalid_value"    // right type, unacceptable value
	CodeMissingModel   = "missing_model"
	CodeMissingMessage = "missing_messages"
	CodeMissingPrompt  = "missing_prompt"
	CodeMissingInput   = "missing_input"
	CodeMissingRole    = "missing_role"
)

// MaxDepth bounds the nesting of arrays and objects (the top-level object
// counts as 1), so hostile bodies cannot make the walkers recurse deeply.
const MaxDepth = 128

func newError(param, code, msg string) *Error {
	return &Error{Status: 400, Type: "invalid_request_error", Param: param, Code: code, Message: msg}
}

// span is a [s,e) byte range of a JSON value in the body; e == 0 means absent
// (no value can end at offset 0 because the top-level '{' precedes it).
type span struct{ s, e int }

func (v span) ok() bool { return v.e > 0 }

// node is the structural index entry the scanner records for every string
// and container, so the later walks never search the bytes again: [s,e) is
// the value; x is, for a string, the index in escs of its first escape (if it
// has any, escs[x] < e) and, for a container, the index of the first node
// after its contents.
type node struct{ s, e, x int32 }

// member is one object member collected for sorting: the key's decoded bytes
// are body[ks:ke] or, for keys with escapes (inK), kbuf[ks:ke].
type member struct {
	ks, ke int
	v      val
	inK    bool
}

// outCap is the size of the render buffer: small pieces (separators, short
// strings, decoded escapes) are batched so the sink sees few, larger writes.
const outCap = 2048

// directMin is the length from which an unescaped run is handed to the sink
// straight from the body instead of being copied.
const directMin = 256

// Request is a parsed request. Reuse one across calls (not concurrently):
// Parse keeps its scratch buffers, so steady-state parsing and rendering do
// not allocate.
type Request struct {
	API       API
	Model     string // required for all four APIs
	CacheSalt string // "cache_salt" when present (vLLM's per-tenant cache isolation)
	Stream    bool

	api  API // as parsed; Render ignores later changes to the exported field
	body []byte
	// Top-level value spans (last duplicate wins).
	model, messages, prompt, input, instructions, tools, cacheSalt, stream span

	msg msgCheck // chat: what the scanner found in "messages"

	nodes []node            // strings and containers in document order
	escs  []int32           // offset of every escape's backslash, in document order
	cur   int               // nodes cursor: the next node a sequential walk will ask for
	mem   []member          // stack of object members being rendered
	kbuf  []byte            // decoded keys (only keys with escapes)
	names map[string]string // interned Model and CacheSalt values

	sink Sink
	n    int
	out  [outCap + 32]byte // +32: slack for decodeRuns' fixed-size copies
}

// Reset drops references to the body so the caller may reuse or free it.
// Scratch buffers are kept.
func (r *Request) Reset() {
	r.API, r.api = APIOther, APIOther
	r.Model, r.CacheSalt, r.Stream = "", "", false
	r.body = nil
	r.model, r.messages, r.prompt, r.input = span{}, span{}, span{}, span{}
	r.instructions, r.tools, r.cacheSalt, r.stream = span{}, span{}, span{}, span{}
	r.msg = msgCheck{}
	r.nodes = r.nodes[:0]
	r.escs = r.escs[:0]
	r.cur = 0
	r.mem = r.mem[:0]
	r.kbuf = r.kbuf[:0]
	r.sink = nil
	r.n = 0
}

// intern returns b as a string, reusing an earlier copy: models and cache
// salts repeat across requests, so steady state allocates nothing while the
// returned strings stay valid after the body is reused.
func (r *Request) intern(b []byte) string {
	if s, ok := r.names[string(b)]; ok {
		return s
	}
	if r.names == nil {
		r.names = make(map[string]string)
	} else if len(r.names) >= 256 {
		clear(r.names)
	}
	s := string(b)
	r.names[s] = s
	return s
}

// Parse validates the whole body as JSON (RFC 8259; invalid UTF-8 inside
// strings is accepted) and records what Render needs. It keeps a reference to
// body (no copy), so the body must not change until Render is done. For
// APIOther the body is not looked at. Duplicate top-level keys: the last one
// wins, like encoding/json. Bodies over math.MaxInt32 bytes are refused
// (offsets are stored as int32). Errors are *Error.
func Parse(api API, body []byte, r *Request) error {
	r.Reset()
	if api == APIOther || api > APIResponses {
		return nil
	}
	r.API, r.api = api, api
	if len(body) > math.MaxInt32 {
		return newError("", CodeTooLarge, "request body too large")
	}
	r.body = body
	if err := r.scan(); err != nil {
		r.body = nil
		return err
	}
	if err := r.check(); err != nil {
		r.body = nil
		return err
	}
	return nil
}
