package subset_test

import (
	"context"
	"testing"

	"github.com/kvpick/kvpick/internal/routertest"
	"github.com/kvpick/kvpick/pkg/plugins/subset"
	"github.com/kvpick/kvpick/pkg/router"
)

func TestSubsetFilter(t *testing.T) {
	tests := []struct {
		name   string
		req    router.Request
		keep   string
		remain int
	}{
		{"no hint keeps all", router.Request{}, "", 3},
		{"hint keeps named", router.Request{HasSubset: true, Subset: []string{"10.0.0.3:8000", "10.0.0.1:8000"}}, "10.0.0.1:8000,10.0.0.3:8000", 2},
		{"empty hint keeps none", router.Request{HasSubset: true}, "", 0},
		{"unknown addresses keep none", router.Request{HasSubset: true, Subset: []string{"192.0.2.1:1"}}, "", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := (&subset.Filter{}).Filter(context.Background(), &tc.req, routertest.Endpoints(0, 0, 0))
			if len(got) != tc.remain || (tc.keep != "" && routertest.Addrs(got) != tc.keep) {
				t.Fatalf("kept %q", routertest.Addrs(got))
			}
		})
	}
}
