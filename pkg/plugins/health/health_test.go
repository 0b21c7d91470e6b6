package health_test

import (
	"context"
	"testing"

	"github.com/kvpick/kvpick/internal/routertest"
	"github.com/kvpick/kvpick/pkg/plugins/health"
	"github.com/kvpick/kvpick/pkg/router"
)

func TestHealthFilterSkipsUnhealthyEndpoints(t *testing.T) {
	eps := routertest.Endpoints(0, 0, 0)
	eps[1].SetHealthy(false)
	got := (&health.Filter{}).Filter(context.Background(), &router.Request{}, eps)
	if routertest.Addrs(got) != "10.0.0.1:8000,10.0.0.3:8000" {
		t.Fatalf("kept %s", routertest.Addrs(got))
	}
	eps = routertest.Endpoints(0)
	eps[0].SetHealthy(false)
	if got := (&health.Filter{}).Filter(context.Background(), &router.Request{}, eps); len(got) != 0 {
		t.Fatal("an unhealthy endpoint was kept")
	}
}
