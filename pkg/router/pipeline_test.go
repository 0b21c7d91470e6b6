package router_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"testing"

	"github.com/kvpick/kvpick/pkg/router"
)

type staticPool []*router.Endpoint

func (p staticPool) Snapshot() []*router.Endpoint { return p }
func (p staticPool) Lookup(addr string) *router.Endpoint {
	for _, e := range p {
		if e.Addr == addr {
			return e
		}
	}
	return nil
}

func endpoints(n int) staticPool {
	var p staticPool
	for i := range n {
		p = append(p, router.NewEndpoint("10.0.0."+string(rune('1'+i))+":8000", i))
	}
	return p
}

// fixedScorer scores endpoints from a table by address.
type fixedScorer struct {
	name   string
	scores map[string]float64
}

func (f *fixedScorer) Name() string { return f.name }
func (f *fixedScorer) Score(_ context.Context, _ *router.Request, eps []*router.Endpoint, s []float64) {
	for i, e := range eps {
		s[i] = f.scores[e.Addr]
	}
}

type maxPicker struct{}

func (maxPicker) Name() string { return "max" }
func (maxPicker) Pick(_ context.Context, _ *router.Request, _ []*router.Endpoint, s []float64) int {
	best := 0
	for i := range s {
		if s[i] > s[best] {
			best = i
		}
	}
	return best
}

type dropAll struct{ shed bool }

func (d dropAll) Name() string { return "drop-all" }
func (d dropAll) Filter(context.Context, *router.Request, []*router.Endpoint) []*router.Endpoint {
	return nil
}
func (d dropAll) Sheds() bool { return d.shed }

// recorder observes the request's life.
type recorder struct {
	events []string
}

func (r *recorder) Name() string { return "recorder" }
func (r *recorder) Picked(_ *router.Request, e *router.Endpoint) {
	r.events = append(r.events, "picked "+e.Addr)
}
func (r *recorder) ResponseHeaders(_ *router.Request, e *router.Endpoint, status int) {
	addr := "<nil>"
	if e != nil {
		addr = e.Addr
	}
	r.events = append(r.events, "response "+addr)
}
func (r *recorder) Done(_ *router.Request, e *router.Endpoint) {
	r.events = append(r.events, "done "+e.Addr)
}

func TestScheduleCombinesWeightedScores(t *testing.T) {
	eps := endpoints(3)
	a := &fixedScorer{"a", map[string]float64{eps[0].Addr: 1, eps[1].Addr: 0, eps[2].Addr: 0.5}}
	b := &fixedScorer{"b", map[string]float64{eps[0].Addr: 0, eps[1].Addr: 1, eps[2].Addr: 0.5}}
	tests := []struct {
		name    string
		weights map[string]float64
		want    string
	}{
		{"a dominates", map[string]float64{"a": 3, "b": 1}, eps[0].Addr},
		{"b dominates", map[string]float64{"a": 1, "b": 3}, eps[1].Addr},
		{"zero weight ignores a scorer", map[string]float64{"a": 0, "b": 1}, eps[1].Addr},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := router.New(router.Config{Pool: eps, Plugins: []router.Plugin{a, b, maxPicker{}}, Weights: tc.weights})
			if err != nil {
				t.Fatal(err)
			}
			d, err := p.Schedule(context.Background(), &router.Request{})
			if err != nil {
				t.Fatal(err)
			}
			if d.Endpoint.Addr != tc.want {
				t.Fatalf("picked %s, want %s", d.Endpoint.Addr, tc.want)
			}
			p.Done(&router.Request{}, d.Endpoint)
		})
	}
}

func TestScheduleClampsEachScoreToZeroOne(t *testing.T) {
	eps := endpoints(2)
	nan := math.NaN()
	tests := []struct {
		name string
		// bad is a misbehaving scorer's scores for eps[0] and eps[1], weight 10; fair scores
		// eps[1] 1 and eps[0] 0, weight 1. Clamped to [0, 1] and NaN taken as 0, bad can only
		// win by what it gives eps[0] over eps[1] — within one unit per unit of weight.
		bad  [2]float64
		want string
	}{
		{"a huge score counts as 1", [2]float64{1e9, 1}, eps[1].Addr},
		{"a negative score counts as 0", [2]float64{0, -1e9}, eps[1].Addr},
		// Unclamped, a NaN sum never compares greater, so the picker would keep eps[0].
		{"NaN counts as 0, not as a poisoned sum", [2]float64{0, nan}, eps[1].Addr},
		{"NaN on the first endpoint counts as 0 too", [2]float64{nan, 0}, eps[1].Addr},
		{"+Inf counts as 1", [2]float64{math.Inf(1), 1}, eps[1].Addr},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bad := &fixedScorer{"bad", map[string]float64{eps[0].Addr: tc.bad[0], eps[1].Addr: tc.bad[1]}}
			fair := &fixedScorer{"fair", map[string]float64{eps[0].Addr: 0, eps[1].Addr: 1}}
			p, err := router.New(router.Config{Pool: eps, Plugins: []router.Plugin{bad, fair, maxPicker{}}, Weights: map[string]float64{"bad": 10, "fair": 1}})
			if err != nil {
				t.Fatal(err)
			}
			req := &router.Request{Explain: &router.Explanation{}}
			d, err := p.Schedule(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Done(req, d.Endpoint)
			if d.Endpoint.Addr != tc.want {
				t.Fatalf("picked %s, want %s", d.Endpoint.Addr, tc.want)
			}
			// The explanation (the explain header's JSON) carries the clamped scores.
			if _, err := json.Marshal(req.Explain); err != nil {
				t.Fatalf("explanation does not encode: %v", err)
			}
		})
	}
}

func TestScheduleErrors(t *testing.T) {
	tests := []struct {
		name   string
		pool   staticPool
		filter router.Plugin
		status int
	}{
		{"empty pool is 503", nil, nil, 503},
		{"filter leaves nothing is 503", endpoints(2), dropAll{shed: false}, 503},
		{"shedding filter leaves nothing is 429", endpoints(2), dropAll{shed: true}, 429},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plugins := []router.Plugin{maxPicker{}}
			if tc.filter != nil {
				plugins = append(plugins, tc.filter)
			}
			p, err := router.New(router.Config{Pool: tc.pool, Plugins: plugins})
			if err != nil {
				t.Fatal(err)
			}
			_, err = p.Schedule(context.Background(), &router.Request{})
			var re *router.Error
			if !errors.As(err, &re) || re.Status != tc.status {
				t.Fatalf("err = %v, want status %d", err, tc.status)
			}
			for _, e := range tc.pool {
				if e.InFlight() != 0 {
					t.Fatalf("a failed schedule left %s with %d in flight", e.Addr, e.InFlight())
				}
			}
		})
	}
}

func TestLifecycleCountsInFlightAndNotifiesInOrder(t *testing.T) {
	eps := endpoints(2)
	rec := &recorder{}
	p, err := router.New(router.Config{Pool: eps, Plugins: []router.Plugin{maxPicker{}, rec}})
	if err != nil {
		t.Fatal(err)
	}
	req := &router.Request{}
	d, err := p.Schedule(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if d.Endpoint.InFlight() != 1 {
		t.Fatalf("in flight after pick = %d, want 1", d.Endpoint.InFlight())
	}
	p.ResponseHeaders(req, d.Endpoint, eps[1].Addr, 200) // the proxy fell back to the other one
	p.ResponseHeaders(req, d.Endpoint, "", 200)          // not reported: the picked one
	p.ResponseHeaders(req, d.Endpoint, "192.0.2.1:1", 200)
	p.Done(req, d.Endpoint)
	if d.Endpoint.InFlight() != 0 {
		t.Fatalf("in flight after done = %d, want 0", d.Endpoint.InFlight())
	}
	want := []string{"picked " + eps[0].Addr, "response " + eps[1].Addr, "response " + eps[0].Addr, "response <nil>", "done " + eps[0].Addr}
	if len(rec.events) != len(want) {
		t.Fatalf("events %q, want %q", rec.events, want)
	}
	for i := range want {
		if rec.events[i] != want[i] {
			t.Fatalf("events %q, want %q", rec.events, want)
		}
	}
}

func TestFallbacksAreRankedByScore(t *testing.T) {
	eps := endpoints(4)
	s := &fixedScorer{"s", map[string]float64{eps[0].Addr: 0.1, eps[1].Addr: 0.9, eps[2].Addr: 0.5, eps[3].Addr: 0.7}}
	p, err := router.New(router.Config{Pool: eps, Plugins: []router.Plugin{s, maxPicker{}}, Fallbacks: 2})
	if err != nil {
		t.Fatal(err)
	}
	d, err := p.Schedule(context.Background(), &router.Request{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Endpoint != eps[1] || len(d.Fallbacks) != 2 || d.Fallbacks[0] != eps[3] || d.Fallbacks[1] != eps[2] {
		t.Fatalf("pick %s fallbacks %v", d.Endpoint.Addr, d.Fallbacks)
	}
}

func TestNewRejectsBadPipelines(t *testing.T) {
	eps := endpoints(1)
	if _, err := router.New(router.Config{Pool: eps}); err == nil {
		t.Error("a pipeline without picker was accepted")
	}
	if _, err := router.New(router.Config{Pool: eps, Plugins: []router.Plugin{maxPicker{}, maxPicker{}}}); err == nil {
		t.Error("two pickers were accepted")
	}
	if _, err := router.New(router.Config{Plugins: []router.Plugin{maxPicker{}}}); err == nil {
		t.Error("a pipeline without pool was accepted")
	}
}

func TestRequestStateIsPerKey(t *testing.T) {
	k1, k2 := router.NewStateKey("one"), router.NewStateKey("two")
	var r router.Request
	r.Set(k1, 1)
	r.Set(k2, "two")
	r.Set(k1, 3)
	if r.Get(k1) != 3 || r.Get(k2) != "two" {
		t.Fatalf("state: %v %v", r.Get(k1), r.Get(k2))
	}
	r.Reset()
	if r.Get(k1) != nil {
		t.Fatal("state survived Reset")
	}
}

type panicOnPick struct{}

func (panicOnPick) Name() string                             { return "panic-on-pick" }
func (panicOnPick) Picked(*router.Request, *router.Endpoint) { panic("boom") }

// TestAPanickingPickObserverLeavesNothingInFlight: the caller never learns a decision whose
// observers panicked, so the pipeline must end the request itself.
func TestAPanickingPickObserverLeavesNothingInFlight(t *testing.T) {
	eps := endpoints(1)
	p, err := router.New(router.Config{Pool: eps, Plugins: []router.Plugin{maxPicker{}, panicOnPick{}}})
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() { _ = recover() }()
		_, _ = p.Schedule(context.Background(), &router.Request{})
		t.Fatal("the observer's panic did not reach the caller")
	}()
	if n := eps[0].InFlight(); n != 0 {
		t.Fatalf("in flight %d after a panicking observer, want 0", n)
	}
}

func TestPrefilledThroughNeverGoesBack(t *testing.T) {
	e := router.NewEndpoint("10.0.0.1:8000", 0)
	for _, tt := range []struct{ set, want int64 }{{3, 3}, {2, 3}, {7, 7}, {0, 7}, {7, 7}} {
		e.SetPrefilledThrough(tt.set)
		if got := e.PrefilledThrough(); got != tt.want {
			t.Fatalf("after SetPrefilledThrough(%d): %d, want %d", tt.set, got, tt.want)
		}
	}
}
