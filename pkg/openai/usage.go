package openai

import "bytes"

// Usage is what a model server reports about a request's prompt in its response: the
// "usage" object of an OpenAI response (the last SSE event of a stream when the client asked for
// stream_options.include_usage; always present in a non-streamed body).
type Usage struct {
	PromptTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens: the prompt tokens the server
	// found in its prefix cache. HasCached is false when the server did not report it (vLLM
	// reports it with --enable-prompt-tokens-details).
	CachedTokens int
	HasCached    bool
}

// UsageTailBytes is how much of the end of a response ParseUsage needs: the usage object comes
// last in OpenAI-style bodies and streams (followed at most by "data: [DONE]"), and with its
// details it is under 300 bytes.
const UsageTailBytes = 1024

var (
	usageKey  = []byte(`"usage"`)
	promptKey = []byte(`"prompt_tokens"`)
	cachedKey = []byte(`"cached_tokens"`)
)

// ParseUsage reads the last "usage" object in tail, the end of a response body. It reports
// false when tail holds no usage object with a prompt_tokens count. It looks for the keys
// rather than parsing the whole event: a key in quotes followed by a colon cannot occur inside
// a JSON string (its quotes would be escaped), and the response may be cut anywhere before the
// usage object.
func ParseUsage(tail []byte) (Usage, bool) {
	i := bytes.LastIndex(tail, usageKey)
	if i < 0 {
		return Usage{}, false
	}
	obj := tail[i+len(usageKey):]
	obj, ok := afterColon(obj)
	if !ok || len(obj) == 0 || obj[0] != '{' {
		return Usage{}, false
	}
	obj = obj[:objectEnd(obj)]
	var u Usage
	if u.PromptTokens, ok = intAfter(obj, promptKey); !ok {
		return Usage{}, false
	}
	u.CachedTokens, u.HasCached = intAfter(obj, cachedKey)
	return u, true
}

// objectEnd returns the length of the JSON object that starts obj ({ ... }), or len(obj) when
// it is cut short. Braces inside strings are skipped.
func objectEnd(obj []byte) int {
	depth, inStr := 0, false
	for i := 0; i < len(obj); i++ {
		c := obj[i]
		switch {
		case inStr:
			if c == '\\' {
				i++
			} else if c == '"' {
				inStr = false
			}
		case c == '"':
			inStr = true
		case c == '{':
			depth++
		case c == '}':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
	return len(obj)
}

// intAfter finds key in obj, followed by a colon, and reads the non-negative integer after it.
func intAfter(obj, key []byte) (int, bool) {
	for {
		i := bytes.Index(obj, key)
		if i < 0 {
			return 0, false
		}
		obj = obj[i+len(key):]
		v, ok := afterColon(obj)
		if !ok {
			continue
		}
		n, digits := 0, 0
		for _, c := range v {
			if c < '0' || c > '9' {
				break
			}
			if n > (1<<31)/10 {
				return 0, false // beyond any prompt
			}
			n = n*10 + int(c-'0')
			digits++
		}
		if digits == 0 || digits == len(v) { // no number, or one cut by the end of the data
			return 0, false
		}
		return n, true
	}
}

// afterColon skips JSON whitespace, a colon and more whitespace.
func afterColon(b []byte) ([]byte, bool) {
	b = skipSpace(b)
	if len(b) == 0 || b[0] != ':' {
		return b, false
	}
	return skipSpace(b[1:]), true
}

func skipSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\n' || b[0] == '\r') {
		b = b[1:]
	}
	return b
}
