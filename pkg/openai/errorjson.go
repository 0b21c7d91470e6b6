package openai

import "encoding/json"

// errorJSON is OpenAI's error body: {"error": {"message", "type", "param", "code"}}.
type errorJSON struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

// ErrorJSON renders an OpenAI-style error body, the shape clients' SDKs parse. An empty param
// is written as null.
func ErrorJSON(typ, code, param, message string) []byte {
	var e errorJSON
	e.Error.Message, e.Error.Type, e.Error.Code = message, typ, code
	if param != "" {
		e.Error.Param = &param
	}
	b, _ := json.Marshal(e) // cannot fail: strings and a pointer to one
	return b
}
