package prefill_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/openai"
	"github.com/kvpick/kvpick/pkg/plugins/prefill"
	"github.com/kvpick/kvpick/pkg/prefix"
	"github.com/kvpick/kvpick/pkg/router"
	"github.com/kvpick/kvpick/pkg/router/routertest"
)

// setup returns a prefix plugin, the prefill scorer and two idle endpoints, the first of which
// holds a 64-block prompt.
func setup(t *testing.T) (*prefix.Plugin, *prefill.Scorer, []*router.Endpoint, string) {
	t.Helper()
	px, err := prefix.New(prefix.Params{BlockSize: 64, MaxBlocksPerRequest: 10000, LRUCapacityPerEndpoint: 10000,
		MinMatchBlocks: 1, PendingTTL: config.Duration(time.Minute)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pf, err := prefill.New(prefill.Params{RequestOverheadBlocks: 2})
	if err != nil {
		t.Fatal(err)
	}
	eps := routertest.Endpoints(0, 0)
	doc := strings.Repeat("a long shared document. ", 170) // ~4 KB: ~64 blocks
	warm := request(t, doc)
	px.Prepare(context.Background(), warm)
	px.Score(context.Background(), warm, eps, make([]float64, 2))
	px.Picked(warm, eps[0])
	px.ResponseHeaders(warm, eps[0], 200)
	px.Done(warm, eps[0])
	return px, pf, eps, doc
}

func request(t *testing.T, content string) *router.Request {
	t.Helper()
	body := fmt.Appendf(nil, `{"model":"m","messages":[{"role":"user","content":%q}]}`, content)
	var b openai.Request
	if err := openai.Parse(openai.APIChatCompletions, body, &b); err != nil {
		t.Fatal(err)
	}
	return &router.Request{API: openai.APIChatCompletions, Body: &b, Model: b.Model}
}

func score(px *prefix.Plugin, pf *prefill.Scorer, req *router.Request, eps []*router.Endpoint) []float64 {
	px.Prepare(context.Background(), req)
	px.Score(context.Background(), req, eps, make([]float64, len(eps)))
	s := make([]float64, len(eps))
	pf.Score(context.Background(), req, eps, s)
	return s
}

func TestCachedPrefixWinsOnAnIdlePool(t *testing.T) {
	px, pf, eps, doc := setup(t)
	s := score(px, pf, request(t, doc+" and a question"), eps)
	if s[0] != 1 || s[1] >= 0.2 {
		t.Fatalf("scores %v: the endpoint holding the prompt must win clearly", s)
	}
}

func TestAQueueOutweighsACachedPrefix(t *testing.T) {
	px, pf, eps, doc := setup(t)
	eps[0].AddQueuedPrefill(500) // ~8 cold prompts of this size queued there
	s := score(px, pf, request(t, doc+" and a question"), eps)
	if s[1] != 1 || s[0] >= s[1] {
		t.Fatalf("scores %v: a long prefill queue must outweigh a 64-block hit", s)
	}
	eps[0].AddQueuedPrefill(-500)
}

func TestChargeIsPaidBackExactlyOnce(t *testing.T) {
	for _, withResponse := range []bool{true, false} {
		px, pf, eps, _ := setup(t)
		req := request(t, strings.Repeat("a brand new prompt. ", 60))
		score(px, pf, req, eps)
		pf.Picked(req, eps[1])
		charged := eps[1].QueuedPrefill()
		if charged < 10 {
			t.Fatalf("a cold ~19-block prompt charged %d blocks", charged)
		}
		if withResponse {
			pf.ResponseHeaders(req, eps[1], 200)
			if q := eps[1].QueuedPrefill(); q != 0 {
				t.Fatalf("after the response the queue is %d", q)
			}
		}
		pf.Done(req, eps[1])
		if q := eps[1].QueuedPrefill(); q != 0 {
			t.Fatalf("withResponse=%v: after the stream ended the queue is %d", withResponse, q)
		}
	}
}

func TestRequestsWithoutPromptCostOnlyTheirOverhead(t *testing.T) {
	_, pf, eps, _ := setup(t)
	req := &router.Request{API: openai.APIOther}
	s := make([]float64, 2)
	pf.Score(context.Background(), req, eps, s)
	if s[0] != 1 || s[1] != 1 {
		t.Fatalf("scores %v on an idle pool", s)
	}
	pf.Picked(req, eps[0])
	if q := eps[0].QueuedPrefill(); q != 2 {
		t.Fatalf("charged %d, want the 2-block overhead", q)
	}
	pf.Done(req, eps[0])
}

func TestValidate(t *testing.T) {
	if _, err := prefill.New(prefill.Params{RequestOverheadBlocks: -1}); err == nil {
		t.Fatal("negative overhead accepted")
	}
}
