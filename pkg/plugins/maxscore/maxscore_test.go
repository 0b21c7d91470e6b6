package maxscore_test

import (
	"context"
	"testing"

	"github.com/kvpick/kvpick/internal/routertest"
	"github.com/kvpick/kvpick/pkg/plugins/maxscore"
	"github.com/kvpick/kvpick/pkg/router"
)

func TestMaxScorePicker(t *testing.T) {
	p := &maxscore.Picker{}
	eps := routertest.Endpoints(0, 0, 0, 0)
	if i := p.Pick(context.Background(), &router.Request{}, eps, []float64{0.1, 0.9, 0.3, 0.2}); i != 1 {
		t.Fatalf("picked %d, want 1", i)
	}
	// Ties with an affinity key: the same key always picks the same endpoint, and different
	// keys spread over the tied endpoints.
	tied := []float64{1, 1, 1, 1}
	seen := map[int]int{}
	for key := uint64(1); key <= 400; key++ {
		req := &router.Request{AffinityKey: key}
		first := p.Pick(context.Background(), req, eps, tied)
		for range 5 {
			if again := p.Pick(context.Background(), req, eps, tied); again != first {
				t.Fatalf("key %d picked %d then %d", key, first, again)
			}
		}
		seen[first]++
	}
	for i := range eps {
		if seen[i] < 60 {
			t.Fatalf("rendezvous tie-break is skewed: %v", seen)
		}
	}
	// Ties without a key are random but only among the best.
	counts := map[int]int{}
	for range 400 {
		counts[p.Pick(context.Background(), &router.Request{}, eps, []float64{1, 0, 1, 0})]++
	}
	if counts[1] != 0 || counts[3] != 0 || counts[0] < 120 || counts[2] < 120 {
		t.Fatalf("random tie-break picked %v", counts)
	}
}
