package engine

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// ImagePartTokens is how many prompt tokens one image (or other non-text
// content part) takes. Their ids derive from the part's URL (or data), so
// the same image caches like the same text.
const ImagePartTokens = 256

// ChatMessage is one message of a chat request, as far as the template
// needs it.
type ChatMessage struct {
	Role string `json:"role"`
	// Content is a JSON string, an array of content parts, or null.
	Content json.RawMessage `json:"content"`
	// ToolCalls of an assistant message, rendered as JSON text.
	ToolCalls json.RawMessage `json:"tool_calls,omitempty"`
}

// systemPreamble is what Llama 3.1's template puts in every system part, so
// all its prompts share a short common prefix (about one block) — as with
// the real server, a prefix that tells a router nothing.
const systemPreamble = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"

const toolsIntro = "You have access to the following functions. To call a function, respond with JSON " +
	"of the form {\"name\": function name, \"parameters\": dictionary of argument name and its value}.\n\n"

// ChatPrompt applies a Llama-3-like chat template and tokenizes the result:
//
//	<|begin_of_text|>
//	<|start_header_id|>system<|end_header_id|>"\n\n" preamble [tools as JSON] [system text]<|eot_id|>
//	<|start_header_id|>{role}<|end_header_id|>"\n\n" {content}<|eot_id|>   (each further message)
//	<|start_header_id|>assistant<|end_header_id|>"\n\n"                    (generation prompt)
//
// Each text segment is tokenized on its own, so the tokens of a
// conversation's earlier turns are an exact prefix of its later turns',
// which is what lets a server's prefix cache hit on multi-turn chats.
// tools is the request's "tools" array (nil or null when absent).
func ChatPrompt(messages []ChatMessage, tools json.RawMessage) ([]uint32, error) {
	toks := make([]uint32, 0, 256)
	toks = append(toks, TokBeginOfText)

	msgs := messages
	var sysText []byte
	sysText = append(sysText, systemPreamble...)
	toolList, err := decodeTools(tools)
	if err != nil {
		return nil, err
	}
	if len(toolList) > 0 {
		sysText = append(sysText, toolsIntro...)
		for _, t := range toolList {
			sysText = append(sysText, t...)
			sysText = append(sysText, "\n\n"...)
		}
	}
	var sysParts []contentPart
	if len(msgs) > 0 && msgs[0].Role == "system" {
		sysParts, err = decodeContent(msgs[0].Content)
		if err != nil {
			return nil, fmt.Errorf("messages[0]: %w", err)
		}
		msgs = msgs[1:]
	}
	toks = appendHeader(toks, "system")
	toks = AppendTokens(toks, string(sysText))
	toks = appendParts(toks, sysParts)
	toks = append(toks, TokEOT)

	for i, m := range msgs {
		if m.Role == "" {
			return nil, fmt.Errorf("messages[%d]: missing role", i)
		}
		parts, err := decodeContent(m.Content)
		if err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		if calls := bytes.TrimSpace(m.ToolCalls); len(calls) > 0 && !bytes.Equal(calls, []byte("null")) {
			c, err := canonicalJSON(calls)
			if err != nil {
				return nil, fmt.Errorf("messages[%d].tool_calls: %w", i, err)
			}
			parts = append(parts, contentPart{text: c})
		}
		role := m.Role
		if role == "tool" {
			role = "ipython" // Llama 3.1's name for tool results
		}
		toks = appendHeader(toks, role)
		toks = appendParts(toks, parts)
		toks = append(toks, TokEOT)
	}
	toks = appendHeader(toks, "assistant")
	return toks, nil
}

func appendHeader(toks []uint32, role string) []uint32 {
	toks = append(toks, TokStartHeader)
	toks = AppendTokens(toks, role)
	toks = append(toks, TokEndHeader)
	return AppendTokens(toks, "\n\n")
}

// contentPart is text, or (when image != "") a non-text part keyed by
// its URL or data.
type contentPart struct {
	text  string
	image string
}

// appendParts tokenizes consecutive text parts as one concatenated text and
// each image as ImagePartTokens ids derived from its key.
func appendParts(toks []uint32, parts []contentPart) []uint32 {
	var text []byte
	for _, p := range parts {
		if p.image == "" {
			text = append(text, p.text...)
			continue
		}
		if len(text) > 0 {
			toks = AppendTokens(toks, string(text))
			text = text[:0]
		}
		toks = appendImage(toks, p.image)
	}
	if len(text) > 0 {
		toks = AppendTokens(toks, string(text))
	}
	return toks
}

func appendImage(toks []uint32, key string) []uint32 {
	h := hashString(key)
	for i := range ImagePartTokens {
		toks = append(toks, uint32(mix64(h, uint64(i))%VocabSize))
	}
	return toks
}

func decodeContent(raw json.RawMessage) ([]contentPart, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("content: %w", err)
		}
		return []contentPart{{text: s}}, nil
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return nil, fmt.Errorf("content: %w", err)
		}
		parts := make([]contentPart, 0, len(items))
		for i, it := range items {
			p, err := decodePart(it)
			if err != nil {
				return nil, fmt.Errorf("content[%d]: %w", i, err)
			}
			parts = append(parts, p)
		}
		return parts, nil
	default:
		return nil, fmt.Errorf("content must be a string, an array of parts or null")
	}
}

func decodePart(raw json.RawMessage) (contentPart, error) {
	var p struct {
		Type     string          `json:"type"`
		Text     *string         `json:"text"`
		ImageURL json.RawMessage `json:"image_url"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return contentPart{}, err
	}
	switch p.Type {
	case "text", "input_text", "output_text":
		if p.Text == nil {
			return contentPart{}, fmt.Errorf("text part without text")
		}
		return contentPart{text: *p.Text}, nil
	case "image_url":
		var url string
		var obj struct {
			URL string `json:"url"`
		}
		if json.Unmarshal(p.ImageURL, &url) != nil || url == "" {
			if err := json.Unmarshal(p.ImageURL, &obj); err != nil || obj.URL == "" {
				return contentPart{}, fmt.Errorf("image_url part without url")
			}
			url = obj.URL
		}
		return contentPart{image: url}, nil
	case "":
		return contentPart{}, fmt.Errorf("content part without type")
	default:
		// Audio, files, video: opaque, keyed by their whole canonical JSON.
		c, err := canonicalJSON(raw)
		if err != nil {
			return contentPart{}, err
		}
		return contentPart{image: c}, nil
	}
}

func decodeTools(raw json.RawMessage) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("tools must be an array: %w", err)
	}
	out := make([]string, 0, len(items))
	for i, it := range items {
		c, err := canonicalJSON(it)
		if err != nil {
			return nil, fmt.Errorf("tools[%d]: %w", i, err)
		}
		out = append(out, c)
	}
	return out, nil
}

// canonicalJSON re-encodes JSON with sorted keys and no insignificant
// whitespace, so key order or formatting in the request does not change
// the prompt.
func canonicalJSON(raw []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return string(bytes.TrimRight(buf.Bytes(), "\n")), nil
}

// CompletionPrompt tokenizes a /v1/completions prompt string, with the BOS
// token the Llama tokenizer adds.
func CompletionPrompt(text string) []uint32 {
	toks := make([]uint32, 0, len(text)/3+2)
	toks = append(toks, TokBeginOfText)
	return AppendTokens(toks, text)
}

// hashString keys an image; the "img" seed keeps image ids apart from the
// ids of text that happens to equal the URL.
func hashString(s string) uint64 {
	return mix64(0x696d67, xxhash.Sum64String(s))
}
