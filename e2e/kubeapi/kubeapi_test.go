package kubeapi

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvpick/kvpick/internal/dataplane"
	"github.com/kvpick/kvpick/internal/kubetest"
	"github.com/kvpick/kvpick/internal/pickerproc"
	"github.com/kvpick/kvpick/pkg/inferencepool"
)

const (
	serving    = healthpb.HealthCheckResponse_SERVING
	notServing = healthpb.HealthCheckResponse_NOT_SERVING
)

var (
	vllm  = map[string]string{"app": "vllm"}
	other = map[string]string{"app": "other"}
)

func waitReady(t *testing.T, p *picker, what string, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	eventually(t, what, func() string {
		if got := p.ready(t); got != want {
			return fmt.Sprintf("readiness %v, want %v", got, want)
		}
		return ""
	})
}

func TestRoutingAndReadinessFollowThePool(t *testing.T) {
	e := newEnv(t)
	_, ports := serve(t, []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"}, 2)
	p1, p2 := ports[0], ports[1]
	pool := kubetest.Pool{Namespace: e.NS, Name: "llama", MatchLabels: vllm, Ports: []int32{p1}}

	p := startPicker(t, e, pickerOpts{pool: "llama"})
	eventually(t, "discovery syncs on the pool's absence", func() string {
		if p.metric(t, "kvpick_pool_synced") != 1 {
			return "kvpick_pool_synced is not 1"
		}
		return ""
	})
	if got := p.ready(t); got != notServing {
		t.Fatalf("readiness with no pool = %v, want NOT_SERVING", got)
	}
	if got := p.route(t, "before the pool exists"); got != "503" {
		t.Fatalf("request with no pool went to %q, want 503", got)
	}

	e.Must(t, "pod a", kubetest.CreatePod(e.Ctx, e.Client, e.NS, "a", vllm, kubetest.PodStatus{IP: "127.0.0.2", Ready: true}))
	e.Must(t, "pool", kubetest.ApplyPool(e.Ctx, e.Dyn, pool))
	waitReady(t, p, "the pool has a Ready pod", serving)
	p.waitRoutes(t, "one Ready pod", 6, addr("127.0.0.2", p1))

	steps := []struct {
		name string
		act  func() error
		want []string // nil: readiness NOT_SERVING and 503
	}{
		{"a second pod turns Ready", func() error {
			return kubetest.CreatePod(e.Ctx, e.Client, e.NS, "b", vllm, kubetest.PodStatus{IP: "127.0.0.3", Ready: true})
		}, []string{addr("127.0.0.2", p1), addr("127.0.0.3", p1)}},
		{"a pod turns unready", func() error {
			return kubetest.SetPodStatus(e.Ctx, e.Client, e.NS, "a", kubetest.PodStatus{IP: "127.0.0.2"})
		}, []string{addr("127.0.0.3", p1)}},
		{"it comes back with another IP", func() error {
			return kubetest.SetPodStatus(e.Ctx, e.Client, e.NS, "a", kubetest.PodStatus{IP: "127.0.0.4", Ready: true})
		}, []string{addr("127.0.0.3", p1), addr("127.0.0.4", p1)}},
		{"a pod is deleted (terminating)", func() error {
			return e.Client.CoreV1().Pods(e.NS).Delete(e.Ctx, "b", metav1.DeleteOptions{})
		}, []string{addr("127.0.0.4", p1)}},
		{"the target port changes", func() error {
			pool.Ports = []int32{p2}
			return kubetest.ApplyPool(e.Ctx, e.Dyn, pool)
		}, []string{addr("127.0.0.4", p2)}},
		{"a second target port", func() error {
			pool.Ports = []int32{p1, p2}
			return kubetest.ApplyPool(e.Ctx, e.Dyn, pool)
		}, []string{addr("127.0.0.4", p1), addr("127.0.0.4", p2)}},
		{"the selector changes", func() error {
			if err := kubetest.CreatePod(e.Ctx, e.Client, e.NS, "c", other, kubetest.PodStatus{IP: "127.0.0.5", Ready: true}); err != nil {
				return err
			}
			pool.MatchLabels = other
			return kubetest.ApplyPool(e.Ctx, e.Dyn, pool)
		}, []string{addr("127.0.0.5", p1), addr("127.0.0.5", p2)}},
		{"the last pod turns unready", func() error {
			return kubetest.SetPodStatus(e.Ctx, e.Client, e.NS, "c", kubetest.PodStatus{IP: "127.0.0.5"})
		}, nil},
		{"it turns Ready again", func() error {
			return kubetest.SetPodStatus(e.Ctx, e.Client, e.NS, "c", kubetest.PodStatus{IP: "127.0.0.5", Ready: true})
		}, []string{addr("127.0.0.5", p1), addr("127.0.0.5", p2)}},
		{"the pool is deleted", func() error {
			return kubetest.DeletePool(e.Ctx, e.Dyn, pool)
		}, nil},
	}
	for _, s := range steps {
		e.Must(t, s.name, s.act())
		if s.want == nil {
			waitReady(t, p, s.name, notServing)
			if got := p.route(t, s.name); got != "503" {
				t.Fatalf("%s: request went to %q, want 503", s.name, got)
			}
			continue
		}
		waitReady(t, p, s.name, serving)
		p.waitRoutes(t, s.name, 4*len(s.want), s.want...)
	}
}

func TestRemovedEndpointsLeaveTheIndex(t *testing.T) {
	e := newEnv(t)
	_, ports := serve(t, []string{"127.0.0.2", "127.0.0.3"}, 1)
	pool := kubetest.Pool{Namespace: e.NS, Name: "p", MatchLabels: vllm, Ports: ports}
	e.Must(t, "pod a", kubetest.CreatePod(e.Ctx, e.Client, e.NS, "a", vllm, kubetest.PodStatus{IP: "127.0.0.2", Ready: true}))
	e.Must(t, "pool", kubetest.ApplyPool(e.Ctx, e.Dyn, pool))
	p := startPicker(t, e, pickerOpts{pool: "p"})
	waitReady(t, p, "ready", serving)
	p.waitRoutes(t, "everything goes to a", 8, addr("127.0.0.2", ports[0]))
	if n := p.metric(t, "kvpick_prefix_index_entries"); n <= 0 {
		t.Fatalf("kvpick_prefix_index_entries = %v after routing prompts, want > 0", n)
	}

	// a leaves, b joins: a's entries go with it, and b has none until it is routed to.
	e.Must(t, "a unready", kubetest.SetPodStatus(e.Ctx, e.Client, e.NS, "a", kubetest.PodStatus{IP: "127.0.0.2"}))
	e.Must(t, "pod b", kubetest.CreatePod(e.Ctx, e.Client, e.NS, "b", vllm, kubetest.PodStatus{IP: "127.0.0.3", Ready: true}))
	eventually(t, "a's index entries are freed", func() string {
		m, err := p.metrics.Scrape(context.Background())
		if err != nil {
			return err.Error()
		}
		if n, eps := m.Value("kvpick_prefix_index_entries"), m.Value("kvpick_pool_endpoints"); n != 0 || eps != 1 {
			return fmt.Sprintf("%v index entries and %v endpoints, want 0 and 1", n, eps)
		}
		return ""
	})
}

func TestV1Alpha2Pool(t *testing.T) {
	e := newEnv(t)
	_, ports := serve(t, []string{"127.0.0.6"}, 2)
	pool := kubetest.Pool{Group: inferencepool.GroupV1Alpha2, Namespace: e.NS, Name: "old", MatchLabels: vllm, Ports: ports[:1]}
	e.Must(t, "pod", kubetest.CreatePod(e.Ctx, e.Client, e.NS, "a", vllm, kubetest.PodStatus{IP: "127.0.0.6", Ready: true}))
	e.Must(t, "pool", kubetest.ApplyPool(e.Ctx, e.Dyn, pool))
	p := startPicker(t, e, pickerOpts{pool: "old", group: inferencepool.GroupV1Alpha2})
	waitReady(t, p, "ready", serving)
	p.waitRoutes(t, "v1alpha2 pool", 4, addr("127.0.0.6", ports[0]))
	pool.Ports = ports[1:]
	e.Must(t, "port", kubetest.ApplyPool(e.Ctx, e.Dyn, pool))
	p.waitRoutes(t, "v1alpha2 targetPortNumber change", 4, addr("127.0.0.6", ports[1]))
}

func TestOnlyTheLeaderIsReadyAndAFollowerTakesOver(t *testing.T) {
	e := newEnv(t)
	_, ports := serve(t, []string{"127.0.0.7"}, 1)
	e.Must(t, "pod", kubetest.CreatePod(e.Ctx, e.Client, e.NS, "a", vllm, kubetest.PodStatus{IP: "127.0.0.7", Ready: true}))
	e.Must(t, "pool", kubetest.ApplyPool(e.Ctx, e.Dyn, kubetest.Pool{Namespace: e.NS, Name: "ha", MatchLabels: vllm, Ports: ports}))
	a := startPicker(t, e, pickerOpts{pool: "ha", leader: true})
	b := startPicker(t, e, pickerOpts{pool: "ha", leader: true})

	var leader, follower *picker
	eventually(t, "one leader", func() string {
		ra, rb := a.ready(t), b.ready(t)
		switch {
		case ra == serving && rb == notServing:
			leader, follower = a, b
		case rb == serving && ra == notServing:
			leader, follower = b, a
		default:
			return fmt.Sprintf("readiness %v and %v, want exactly one SERVING", ra, rb)
		}
		return ""
	})
	if leader.metric(t, "kvpick_ha_leader") != 1 || follower.metric(t, "kvpick_ha_leader") != 0 {
		t.Fatal("kvpick_ha_leader disagrees with readiness")
	}
	// The follower stays not ready: it holds no lease however long it waits (a few retries).
	for range 5 {
		if got := follower.ready(t); got != notServing {
			t.Fatalf("the follower reports %v", got)
		}
	}
	// Its discovery and health checks are warm: asked directly, it routes (once its first
	// probe of the endpoint has passed, like any picker).
	eventually(t, "the follower routes", func() string {
		if got := follower.route(t, "to the follower"); got != addr("127.0.0.7", ports[0]) {
			return "the follower routed to " + got
		}
		return ""
	})

	leader.stop(t)
	waitReady(t, follower, "the follower takes over when the leader stops", serving)
	if follower.metric(t, "kvpick_ha_leader") != 1 {
		t.Fatal("kvpick_ha_leader is not 1 on the new leader")
	}
}

// The cmd/extproc binary, started with the reference chart's command line (its flags for the
// pool, logging and features this picker does not have), follows the pool.
func TestBinaryTakesTheReferenceChartsFlags(t *testing.T) {
	e := newEnv(t)
	_, ports := serve(t, []string{"127.0.0.8"}, 1)
	e.Must(t, "pod", kubetest.CreatePod(e.Ctx, e.Client, e.NS, "a", vllm, kubetest.PodStatus{IP: "127.0.0.8", Ready: true}))
	e.Must(t, "pool", kubetest.ApplyPool(e.Ctx, e.Dyn, kubetest.Pool{Namespace: e.NS, Name: "chart", MatchLabels: vllm, Ports: ports}))

	root, err := pickerproc.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	bin, err := pickerproc.Build(ctx, root, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NAMESPACE", e.NS) // the reference chart's downward-API variable
	proc, err := pickerproc.Start(ctx, pickerproc.Options{Bin: bin, Args: []string{
		"--pool-name", "chart", "--kubeconfig", e.Cluster.KubeconfigPath(),
		"--zap-encoder", "json", "-v", "3",
		"--total-queued-requests-metric", "nv_trt_llm_request_metrics{request_type=waiting}",
		"--lora-info-metric", "",
		"--tracing=false", "--metrics-endpoint-auth=false",
		"--shutdown-delay=0s",
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proc.Stop() })

	conn := dial(t, proc.GRPCAddr)
	// Ready as soon as the pool has an endpoint; the endpoint takes requests after its first
	// good probe.
	eventually(t, "the binary routes to the pool's pod", func() string {
		routed, _, err := dataplane.New(conn, dataplane.WithMessageTimeout(settle)).Do(ctx, dataplane.FullDuplex(),
			&dataplane.HTTPRequest{Method: "POST", Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":"hello"}`)},
			&dataplane.HTTPResponse{Status: http.StatusOK, Body: []byte(`{}`)})
		switch {
		case err != nil:
			return err.Error()
		case routed.Destination != addr("127.0.0.8", ports[0]):
			return fmt.Sprintf("routed %+v", routed)
		}
		return ""
	})
	if logs := proc.Logs(); !strings.Contains(logs, "accepted and ignored") || !strings.Contains(logs, "total-queued-requests-metric") {
		t.Fatalf("no log line naming the ignored flags:\n%s", logs)
	}
}
