package loadguard_test

import (
	"context"
	"testing"

	"github.com/kvpick/kvpick/internal/routertest"
	"github.com/kvpick/kvpick/pkg/plugins/loadguard"
	"github.com/kvpick/kvpick/pkg/router"
)

func TestLoadGuardExcludesOnlyWhenBothMarginsAreExceeded(t *testing.T) {
	g, err := loadguard.New(loadguard.Params{AbsoluteMargin: 4, RelativeMargin: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		loads []int64
		keep  []int
	}{
		{"balanced", []int64{3, 4, 5}, []int{0, 1, 2}},
		{"relative exceeded, absolute not", []int64{1, 5}, []int{0, 1}},
		{"both exceeded", []int64{1, 6, 2}, []int{0, 2}},
		{"absolute exceeded, relative not", []int64{100, 106, 120}, []int{0, 1, 2}},
		{"idle pool, one hot", []int64{0, 0, 9}, []int{0, 1}},
		{"single endpoint always kept", []int64{50}, []int{0}},
		// More endpoints than the guard's on-stack buffer of loads: the least loaded sits last.
		{"a pool of 300, the least loaded last", append(repeat(20, 299), 1), seq(299, 300)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps := routertest.Endpoints(tc.loads...)
			var want []*router.Endpoint
			for _, i := range tc.keep {
				want = append(want, eps[i])
			}
			if got := g.Filter(context.Background(), &router.Request{}, eps); routertest.Addrs(got) != routertest.Addrs(want) {
				t.Fatalf("kept %s, want %s", routertest.Addrs(got), routertest.Addrs(want))
			}
		})
	}
	if _, err := loadguard.New(loadguard.Params{AbsoluteMargin: -1}); err == nil {
		t.Error("negative margin accepted")
	}
}

func repeat(load int64, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = load
	}
	return out
}

func seq(from, to int) []int {
	var out []int
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}
