package inflight_test

import (
	"context"
	"math"
	"testing"

	"github.com/kvpick/kvpick/internal/routertest"
	"github.com/kvpick/kvpick/pkg/plugins/inflight"
	"github.com/kvpick/kvpick/pkg/router"
)

func TestInflightScorerPrefersLessLoaded(t *testing.T) {
	tests := []struct {
		loads []int64
		want  []float64
	}{
		{[]int64{0, 0}, []float64{1, 1}},
		{[]int64{0, 1}, []float64{1, 0.5}},
		{[]int64{10, 11}, []float64{1 - 10.0/12, 1 - 11.0/12}},
		{[]int64{0, 3, 1}, []float64{1, 0.25, 0.75}},
	}
	for _, tc := range tests {
		eps := routertest.Endpoints(tc.loads...)
		s := make([]float64, len(eps))
		(&inflight.Scorer{}).Score(context.Background(), &router.Request{}, eps, s)
		for i := range s {
			if math.Abs(s[i]-tc.want[i]) > 1e-9 {
				t.Fatalf("loads %v: scores %v, want %v", tc.loads, s, tc.want)
			}
		}
	}
}
