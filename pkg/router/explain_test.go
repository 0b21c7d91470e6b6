package router_test

import (
	"context"
	"testing"

	"github.com/kvpick/kvpick/pkg/router"
)

// TestExplanationHoldsEveryCandidatesScores: a request that carries an Explanation gets each
// candidate's score from each scorer (clamped to [0,1], as summed), its weighted total and which
// one was picked; the same Explanation reused for a request that nothing can serve holds no
// stale candidates.
func TestExplanationHoldsEveryCandidatesScores(t *testing.T) {
	eps := endpoints(3)
	a := &fixedScorer{"a", map[string]float64{eps[0].Addr: 0.5, eps[1].Addr: 1, eps[2].Addr: 2}}
	b := &fixedScorer{"b", map[string]float64{eps[0].Addr: 1, eps[1].Addr: 0, eps[2].Addr: -1}}
	p, err := router.New(router.Config{Pool: eps, Plugins: []router.Plugin{a, b, maxPicker{}}, Weights: map[string]float64{"a": 1, "b": 3}})
	if err != nil {
		t.Fatal(err)
	}
	x := &router.Explanation{}
	req := &router.Request{Explain: x}
	d, err := p.Schedule(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Done(req, d.Endpoint)
	if len(x.Scorers) != 2 || x.Scorers[0] != "a" || x.Scorers[1] != "b" || x.Weights[0] != 1 || x.Weights[1] != 3 {
		t.Fatalf("scorers %v weights %v", x.Scorers, x.Weights)
	}
	want := map[string]struct{ a, b, total float64 }{
		eps[0].Addr: {0.5, 1, 3.5},
		eps[1].Addr: {1, 0, 1},
		eps[2].Addr: {1, 0, 1}, // 2 and -1 clamped
	}
	if len(x.Candidates) != 3 {
		t.Fatalf("%d candidates", len(x.Candidates))
	}
	for _, c := range x.Candidates {
		w := want[c.Endpoint.Addr]
		if c.Scores[0] != w.a || c.Scores[1] != w.b || c.Total != w.total {
			t.Errorf("%s: scores %v total %v, want %v", c.Endpoint.Addr, c.Scores, c.Total, w)
		}
	}
	if x.Picked < 0 || x.Candidates[x.Picked].Endpoint != d.Endpoint || d.Endpoint != eps[0] {
		t.Fatalf("picked %d (%v), decision %s", x.Picked, x.Candidates, d.Endpoint.Addr)
	}

	none, err := router.New(router.Config{Pool: eps, Plugins: []router.Plugin{dropAll{}, a, maxPicker{}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := none.Schedule(context.Background(), &router.Request{Explain: x}); err == nil {
		t.Fatal("routed with every endpoint filtered out")
	}
	if len(x.Candidates) != 0 || x.Picked != -1 {
		t.Fatalf("a request nothing could serve is explained with %d candidates, picked %d", len(x.Candidates), x.Picked)
	}
}
