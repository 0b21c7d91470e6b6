package saturation_test

import (
	"context"
	"testing"

	"github.com/kvpick/kvpick/internal/routertest"
	"github.com/kvpick/kvpick/pkg/plugins/saturation"
	"github.com/kvpick/kvpick/pkg/router"
)

func TestSaturationFilterSheds(t *testing.T) {
	f, err := saturation.New(saturation.Params{MaxInFlightPerEndpoint: 5})
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Filter(context.Background(), &router.Request{}, routertest.Endpoints(5, 4, 9)); routertest.Addrs(got) != "10.0.0.2:8000" {
		t.Fatalf("kept %s", routertest.Addrs(got))
	}
	if !f.Sheds() {
		t.Fatal("saturation filter must report shedding")
	}
	off, _ := saturation.New(saturation.Params{})
	if got := off.Filter(context.Background(), &router.Request{}, routertest.Endpoints(5000, 1)); len(got) != 2 {
		t.Fatal("limit 0 must disable shedding")
	}
}
