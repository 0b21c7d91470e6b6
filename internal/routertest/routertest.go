// Package routertest has helpers for testing plugins.
package routertest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvpick/kvpick/pkg/openai"
	"github.com/kvpick/kvpick/pkg/router"
)

// Endpoints returns endpoints 10.0.0.1:8000, 10.0.0.2:8000, ... in slots 0, 1, ... with the
// given in-flight loads.
func Endpoints(loads ...int64) []*router.Endpoint {
	eps := make([]*router.Endpoint, len(loads))
	for i, l := range loads {
		eps[i] = router.NewEndpoint(fmt.Sprintf("10.0.0.%d:8000", i+1), i)
		eps[i].AddInFlight(l)
	}
	return eps
}

// Addrs joins the endpoints' addresses with commas.
func Addrs(eps []*router.Endpoint) string {
	s := make([]string, len(eps))
	for i, e := range eps {
		s[i] = e.Addr
	}
	return strings.Join(s, ",")
}

// Chat returns a parsed chat-completions request for model "m" with one user message.
func Chat(t testing.TB, content string) *router.Request {
	t.Helper()
	body := fmt.Appendf(nil, `{"model":"m","messages":[{"role":"user","content":%q}]}`, content)
	var b openai.Request
	if err := openai.Parse(openai.APIChatCompletions, body, &b); err != nil {
		t.Fatal(err)
	}
	return &router.Request{API: openai.APIChatCompletions, Body: &b, Model: b.Model}
}
