package openai

import (
	"encoding/json"
	"testing"
)

func TestErrorJSONHasOpenAIsShape(t *testing.T) {
	for _, param := range []string{"", "model"} {
		var got map[string]map[string]any
		if err := json.Unmarshal(ErrorJSON("invalid_request_error", "missing_model", param, `"model" is required`), &got); err != nil {
			t.Fatal(err)
		}
		e := got["error"]
		if e["message"] != `"model" is required` || e["type"] != "invalid_request_error" || e["code"] != "missing_model" {
			t.Fatalf("error body %v", got)
		}
		if p, present := e["param"]; !present || (param == "" && p != nil) || (param != "" && p != param) {
			t.Fatalf("param %v (present %v), want %q or null", p, present, param)
		}
	}
}
