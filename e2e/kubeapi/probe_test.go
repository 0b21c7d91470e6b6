package kubeapi

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/kvpick/kvpick/internal/kubetest"
)

// A pod that is Ready but whose server fails the picker's health probe is never routed to: new
// endpoints wait for their first good probe (with a threshold so high that a healthy-by-default
// endpoint would never be taken out, only that rule keeps it out).
func TestAReadyPodWaitsForItsFirstGoodProbe(t *testing.T) {
	e := newEnv(t)
	s, ports := serve(t, []string{"127.0.0.9", "127.0.0.10"}, 1)
	good, bad := addr("127.0.0.9", ports[0]), addr("127.0.0.10", ports[0])
	s.setHealth(bad, http.StatusServiceUnavailable)
	e.Must(t, "pod", kubetest.CreatePod(e.Ctx, e.Client, e.NS, "good", vllm, kubetest.PodStatus{IP: "127.0.0.9", Ready: true}))
	e.Must(t, "pool", kubetest.ApplyPool(e.Ctx, e.Dyn, kubetest.Pool{Namespace: e.NS, Name: "probe", MatchLabels: vllm, Ports: ports}))
	p := startPicker(t, e, pickerOpts{pool: "probe", unhealthyThreshold: 1000})
	waitReady(t, p, "ready", serving)
	p.waitRoutes(t, "the healthy pod", 4, good)

	e.Must(t, "pod", kubetest.CreatePod(e.Ctx, e.Client, e.NS, "bad", vllm, kubetest.PodStatus{IP: "127.0.0.10", Ready: true}))
	eventually(t, "the failing pod joins the pool", func() string {
		if n := p.metric(t, "kvpick_pool_endpoints"); n != 2 {
			return fmt.Sprintf("%v endpoints", n)
		}
		return ""
	})
	if got := p.destinations(t, 20, "after the failing pod joined"); len(got) != 1 || got[0] != good {
		t.Fatalf("routed to %v: a pod that never passed a probe was picked", got)
	}
	s.setHealth(bad, http.StatusOK)
	p.waitRoutes(t, "once its probe passes", 12, good, bad)
}
