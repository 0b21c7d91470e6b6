package manifests

import (
	"fmt"
	"io"
	"log/slog"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/loader"
	"helm.sh/helm/v4/pkg/release"
	"helm.sh/helm/v4/pkg/strvals"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/kvpick/kvpick/config"
)

const chartDir = "charts/kvpick"

// The release every chart test installs, and the values every render needs.
const (
	testRelease   = "llama"
	testNamespace = "llm"
)

var requiredSets = []string{
	"inferencePool.modelServers.matchLabels.app=vllm-llama",
	"inferenceExtension.image.hub=registry.example/team",
	"inferenceExtension.image.tag=v1.2.3",
}

// renderChart renders the chart as `helm template llama charts/kvpick -n llm --set ...` does
// (Helm's SDK, client-only dry run: values schema, templates, `fail`s and `required`s all run),
// with the required values plus sets (applied in order, --set syntax) and an optional values
// document (-f), and returns its objects.
func renderChart(t *testing.T, valuesYAML string, sets ...string) ([]object, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("loading the chart: %v", err)
	}
	vals := map[string]any{}
	if valuesYAML != "" {
		docs, err := parseDocs("values", []byte(valuesYAML))
		if err != nil || len(docs) != 1 {
			t.Fatalf("values document: %v", err)
		}
		vals = docs[0].Raw
	}
	for _, s := range append(slices.Clone(requiredSets), sets...) {
		if err := strvals.ParseInto(s, vals); err != nil {
			t.Fatalf("--set %s: %v", s, err)
		}
	}
	cfg := action.NewConfiguration(action.ConfigurationSetLogger(slog.NewTextHandler(io.Discard, nil)))
	install := action.NewInstall(cfg)
	install.DryRunStrategy = action.DryRunClient
	install.ReleaseName = testRelease
	install.Namespace = testNamespace
	install.Replace = true
	kv, err := common.ParseKubeVersion("v1.37.2")
	if err != nil {
		t.Fatal(err)
	}
	install.KubeVersion = kv
	rel, err := install.Run(ch, vals)
	if err != nil {
		return nil, err
	}
	acc, err := release.NewAccessor(rel)
	if err != nil {
		t.Fatal(err)
	}
	return parseDocs("chart", []byte(acc.Manifest()))
}

func mustRender(t *testing.T, valuesYAML string, sets ...string) []object {
	t.Helper()
	objs, err := renderChart(t, valuesYAML, sets...)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return objs
}

// typed decodes the one object of that kind (and name, if given) into v, refusing unknown fields.
func typed(t *testing.T, objs []object, kind, name string, v any) {
	t.Helper()
	var found []object
	for _, o := range objs {
		if o.Kind() == kind && (name == "" || o.Name() == name) {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one %s %q, found %d", kind, name, len(found))
	}
	if err := found[0].decode(v); err != nil {
		t.Fatal(err)
	}
}

func kinds(objs []object) []string {
	var k []string
	for _, o := range objs {
		k = append(k, o.Kind())
	}
	slices.Sort(k)
	return k
}

// argValue returns the value of --name=value in args ("" and false when absent).
func argValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name {
			return "true", true
		}
	}
	return "", false
}

func picker(t *testing.T, objs []object) (*appsv1.Deployment, *corev1.Container) {
	t.Helper()
	var d appsv1.Deployment
	typed(t, objs, "Deployment", testRelease+"-epp", &d)
	if n := len(d.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("picker pod has %d containers, want 1", n)
	}
	return &d, &d.Spec.Template.Spec.Containers[0]
}

// TestChartDefaultRender checks what `helm install` with only the required values creates: the
// pool, the picker and its least-privilege access, and nothing provider-specific.
func TestChartDefaultRender(t *testing.T) {
	objs := mustRender(t, "")
	want := []string{"ConfigMap", "Deployment", "InferencePool", "Role", "RoleBinding", "Service", "ServiceAccount"}
	if got := kinds(objs); !slices.Equal(got, want) {
		t.Fatalf("kinds %v, want %v", got, want)
	}
	for _, o := range objs {
		if o.Namespace() != testNamespace {
			t.Errorf("%s: namespace %q, want the release's %q", o, o.Namespace(), testNamespace)
		}
	}

	// The pool: selector, ports and the picker's Service.
	var pool inferencePool
	typed(t, objs, "InferencePool", testRelease, &pool)
	if pool.APIVersion != "inference.networking.k8s.io/v1" {
		t.Errorf("InferencePool apiVersion %q", pool.APIVersion)
	}
	if !maps.Equal(pool.Spec.Selector.MatchLabels, map[string]string{"app": "vllm-llama"}) {
		t.Errorf("pool selector %v", pool.Spec.Selector.MatchLabels)
	}
	if len(pool.Spec.TargetPorts) != 1 || pool.Spec.TargetPorts[0].Number != 8000 {
		t.Errorf("pool targetPorts %+v, want [8000]", pool.Spec.TargetPorts)
	}
	ref := pool.Spec.EndpointPickerRef
	if ref.Kind != "Service" || ref.Name != testRelease+"-epp" || ref.Port == nil || ref.Port.Number != 9002 || ref.FailureMode != "FailClose" {
		t.Errorf("endpointPickerRef %+v", ref)
	}

	// The Service the pool names: ext_proc over HTTP/2 on 9002, metrics on 9090, selecting the picker.
	var svc corev1.Service
	typed(t, objs, "Service", ref.Name, &svc)
	ports := map[int32]corev1.ServicePort{}
	for _, p := range svc.Spec.Ports {
		ports[p.Port] = p
	}
	if p := ports[9002]; p.TargetPort.String() != "grpc" || p.AppProtocol == nil || *p.AppProtocol != "http2" {
		t.Errorf("Service port 9002: %+v, want targetPort grpc, appProtocol http2", p)
	}
	if p := ports[9090]; p.TargetPort.String() != "metrics" {
		t.Errorf("Service port 9090: %+v, want targetPort metrics", p)
	}

	d, c := picker(t, objs)
	for k, v := range svc.Spec.Selector {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("Service selector %s=%s does not select the picker's pods %v", k, v, d.Spec.Template.Labels)
		}
	}
	for k, v := range pool.Spec.Selector.MatchLabels {
		if d.Spec.Template.Labels[k] == v {
			t.Errorf("the pool's selector %s=%s selects the picker itself", k, v)
		}
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
		t.Errorf("replicas %v, want 1", d.Spec.Replicas)
	}
	if s := d.Spec.Strategy; s.Type != appsv1.RollingUpdateDeploymentStrategyType || s.RollingUpdate == nil || s.RollingUpdate.MaxUnavailable.IntValue() != 0 {
		t.Errorf("strategy %+v: a single picker must be replaced only once its successor is Ready", s)
	}
	if c.Image != "registry.example/team/kvpick:v1.2.3" {
		t.Errorf("image %q", c.Image)
	}
	for flag, want := range map[string]string{
		"pool-name":      testRelease,
		"pool-namespace": "$(NAMESPACE)",
		"pool-group":     "inference.networking.k8s.io",
		"config-file":    "/config/config.yaml",
		"grpc-port":      "9002",
	} {
		if got, _ := argValue(c.Args, flag); got != want {
			t.Errorf("--%s=%q, want %q (args %v)", flag, got, want, c.Args)
		}
	}
	for _, flag := range []string{"ha-enable-leader-election", "endpoints", "secure-serving", "cert-path"} {
		if v, ok := argValue(c.Args, flag); ok {
			t.Errorf("--%s=%s set by default", flag, v)
		}
	}
	// The pool's namespace reaches the picker through the downward API.
	var ns *corev1.EnvVar
	for i := range c.Env {
		if c.Env[i].Name == "NAMESPACE" {
			ns = &c.Env[i]
		}
	}
	if ns == nil || ns.ValueFrom == nil || ns.ValueFrom.FieldRef == nil || ns.ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
		t.Errorf("env NAMESPACE: %+v, want the downward API's metadata.namespace", ns)
	}
	checkGrace(t, d, c)
	for probe, want := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if want == nil || want.GRPC == nil || want.GRPC.Port != 9003 || want.GRPC.Service == nil || *want.GRPC.Service != probe {
			t.Errorf("%s probe %+v, want gRPC service %q on 9003", probe, want, probe)
		}
	}
	pod := d.Spec.Template.Spec
	sc := c.SecurityContext
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot ||
		sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("security context: pod %+v, container %+v: want non-root, read-only root, no escalation, ALL dropped", pod.SecurityContext, sc)
	}
	if pod.AutomountServiceAccountToken != nil && !*pod.AutomountServiceAccountToken {
		t.Error("the picker watches the API: its service account token must be mounted")
	}

	// Access: its own service account, bound to a Role that reads pods and pools only.
	var sa corev1.ServiceAccount
	typed(t, objs, "ServiceAccount", pod.ServiceAccountName, &sa)
	var role rbacv1.Role
	typed(t, objs, "Role", "", &role)
	want = []string{"/pods:get,list,watch", "inference.networking.k8s.io/inferencepools:get,list,watch"}
	if got := ruleStrings(role.Rules); !slices.Equal(got, want) {
		t.Errorf("Role rules %v, want %v", got, want)
	}
	var rb rbacv1.RoleBinding
	typed(t, objs, "RoleBinding", "", &rb)
	if rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != role.Name || len(rb.Subjects) != 1 ||
		rb.Subjects[0].Kind != "ServiceAccount" || rb.Subjects[0].Name != sa.Name || rb.Subjects[0].Namespace != testNamespace {
		t.Errorf("RoleBinding %+v does not bind Role %q to ServiceAccount %q", rb, role.Name, sa.Name)
	}

	// The configuration file: mounted where --config-file points, and valid.
	text := configFileText(t, objs, c)
	if _, err := config.Parse([]byte(text)); err != nil {
		t.Errorf("config.yaml: %v\n%s", err, text)
	}
}

// checkGrace: Kubernetes must not kill the picker before it has drained (--shutdown-delay, then
// up to --drain-timeout), nor wait much longer than that.
func checkGrace(t *testing.T, d *appsv1.Deployment, c *corev1.Container) {
	t.Helper()
	var sum time.Duration
	for _, flag := range []string{"drain-timeout", "shutdown-delay"} {
		v, ok := argValue(c.Args, flag)
		dur, err := time.ParseDuration(v)
		if !ok || err != nil {
			t.Fatalf("--%s=%q: want a duration (%v)", flag, v, err)
		}
		sum += dur
	}
	g := d.Spec.Template.Spec.TerminationGracePeriodSeconds
	if g == nil {
		t.Fatal("no terminationGracePeriodSeconds")
	}
	grace := time.Duration(*g) * time.Second
	if grace < sum || grace > sum+10*time.Second {
		t.Errorf("terminationGracePeriodSeconds %v, want drain + delay (%v) plus a few seconds", grace, sum)
	}
}

func ruleStrings(rules []rbacv1.PolicyRule) []string {
	var out []string
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				out = append(out, g+"/"+res+":"+strings.Join(r.Verbs, ","))
			}
		}
	}
	slices.Sort(out)
	return out
}

// configFileText returns the text of the file --config-file names, from the ConfigMap mounted there.
func configFileText(t *testing.T, objs []object, c *corev1.Container) string {
	t.Helper()
	file, _ := argValue(c.Args, "config-file")
	dir, name, _ := strings.Cut(strings.TrimPrefix(file, "/"), "/")
	d, _ := picker(t, objs)
	var mount *corev1.VolumeMount
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == "/"+dir {
			mount = &c.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Fatalf("--config-file=%s: nothing is mounted at /%s", file, dir)
	}
	var cmName string
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == mount.Name && v.ConfigMap != nil {
			cmName = v.ConfigMap.Name
		}
	}
	var cm corev1.ConfigMap
	typed(t, objs, "ConfigMap", cmName, &cm)
	text, ok := cm.Data[name]
	if !ok {
		t.Fatalf("ConfigMap %q has no %q (keys %v)", cmName, name, slices.Sorted(maps.Keys(cm.Data)))
	}
	return text
}

// TestChartVariants renders the chart with each provider and option and checks what changes.
func TestChartVariants(t *testing.T) {
	tests := []struct {
		name   string
		values string
		sets   []string
		check  func(t *testing.T, objs []object)
	}{
		{"istio adds the DestinationRule the self-signed TLS needs", "", []string{"provider.name=istio"}, func(t *testing.T, objs []object) {
			var dr struct {
				header
				Spec struct {
					Host          string         `json:"host"`
					TrafficPolicy map[string]any `json:"trafficPolicy"`
				} `json:"spec"`
			}
			typed(t, objs, "DestinationRule", "", &dr)
			if dr.APIVersion != "networking.istio.io/v1" || dr.Spec.Host != "llama-epp.llm.svc.cluster.local" {
				t.Errorf("DestinationRule %s host %q", dr.APIVersion, dr.Spec.Host)
			}
			if tls := dr.Spec.TrafficPolicy["tls"]; !reflect.DeepEqual(tls, map[string]any{"mode": "SIMPLE", "insecureSkipVerify": true}) {
				t.Errorf("trafficPolicy.tls %v, want SIMPLE without verification", tls)
			}
		}},
		{"istio keeps the user's traffic policy and drops TLS with plaintext", "istio:\n  destinationRule:\n    trafficPolicy:\n      connectionPool:\n        http:\n          http2MaxRequests: 100000\n",
			[]string{"provider.name=istio", "inferenceExtension.tls.enabled=false"}, func(t *testing.T, objs []object) {
				var dr struct {
					header
					Spec map[string]any `json:"spec"`
				}
				typed(t, objs, "DestinationRule", "", &dr)
				if got := at(dr.Spec, "trafficPolicy", "tls", "mode"); got != "DISABLE" {
					t.Errorf("tls mode %v, want DISABLE", got)
				}
				if got := at(dr.Spec, "trafficPolicy", "connectionPool", "http", "http2MaxRequests"); got != float64(100000) {
					t.Errorf("connectionPool lost: %v", dr.Spec)
				}
				_, c := picker(t, objs)
				if v, _ := argValue(c.Args, "secure-serving"); v != "false" {
					t.Errorf("--secure-serving=%q, want false", v)
				}
			}},
		{"gke adds the pool's health check and backend policy", "", []string{"provider.name=gke"}, func(t *testing.T, objs []object) {
			for _, kind := range []string{"HealthCheckPolicy", "GCPBackendPolicy"} {
				var p struct {
					header
					Spec map[string]any `json:"spec"`
				}
				typed(t, objs, kind, testRelease, &p)
				if p.APIVersion != "networking.gke.io/v1" || !reflect.DeepEqual(p.Spec["targetRef"], map[string]any{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": testRelease}) {
					t.Errorf("%s: %s targetRef %v", kind, p.APIVersion, p.Spec["targetRef"])
				}
			}
			var hc struct {
				header
				Spec map[string]any `json:"spec"`
			}
			typed(t, objs, "HealthCheckPolicy", "", &hc)
			if got := at(hc.Spec, "default", "config", "httpHealthCheck"); !reflect.DeepEqual(got, map[string]any{"requestPath": "/health", "port": float64(8000)}) {
				t.Errorf("httpHealthCheck %v, want /health on the pool's port 8000", got)
			}
		}},
		{"more than one replica is active-passive", "", []string{"inferenceExtension.replicas=3"}, func(t *testing.T, objs []object) {
			d, c := picker(t, objs)
			if v, ok := argValue(c.Args, "ha-enable-leader-election"); !ok || v != "true" {
				t.Errorf("args %v: want --ha-enable-leader-election", c.Args)
			}
			if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
				t.Errorf("strategy %q: a standby is never Ready, so a rolling update would never finish", d.Spec.Strategy.Type)
			}
			var role rbacv1.Role
			typed(t, objs, "Role", "", &role)
			if got := ruleStrings(role.Rules); !slices.Contains(got, "coordination.k8s.io/leases:create,get,update") {
				t.Errorf("Role rules %v: want leases create,get,update", got)
			}
			env := map[string]string{}
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
					env[e.Name] = e.ValueFrom.FieldRef.FieldPath
				}
			}
			if env["POD_NAME"] != "metadata.name" {
				t.Errorf("env %v: the leader identity needs POD_NAME from the downward API", env)
			}
		}},
		{"active-active replicas share their commits through a headless Service", "", []string{"inferenceExtension.replicas=2", "inferenceExtension.highAvailability=active"}, func(t *testing.T, objs []object) {
			d, c := picker(t, objs)
			if _, ok := argValue(c.Args, "ha-enable-leader-election"); ok {
				t.Errorf("args %v: active-active must not elect a leader", c.Args)
			}
			if v, _ := argValue(c.Args, "peers"); v != testRelease+"-epp-peers."+testNamespace+".svc:9090" {
				t.Errorf("--peers %q, want the headless Service on the metrics port", v)
			}
			if d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType {
				t.Errorf("strategy %q: every replica is Ready, so a rolling update works", d.Spec.Strategy.Type)
			}
			var svc corev1.Service
			typed(t, objs, "Service", testRelease+"-epp-peers", &svc)
			if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses ||
				!reflect.DeepEqual(svc.Spec.Selector, d.Spec.Selector.MatchLabels) ||
				len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 9090 || svc.Spec.Ports[0].TargetPort.StrVal != "metrics" {
				t.Errorf("peers Service %+v: want headless, every pod, port 9090 → metrics", svc.Spec)
			}
			for _, o := range objs {
				if o.Kind() == "Role" {
					var role rbacv1.Role
					typed(t, objs, "Role", "", &role)
					if slices.Contains(ruleStrings(role.Rules), "coordination.k8s.io/leases:create,get,update") {
						t.Errorf("Role rules %v: no Lease without leader election", ruleStrings(role.Rules))
					}
				}
			}
		}},
		{"one replica has no peers", "", []string{"inferenceExtension.highAvailability=active"}, func(t *testing.T, objs []object) {
			_, c := picker(t, objs)
			if _, ok := argValue(c.Args, "peers"); ok {
				t.Errorf("args %v: one replica has no peers", c.Args)
			}
			for _, o := range objs {
				if o.Kind() == "Service" && strings.HasSuffix(o.Name(), "-peers") {
					t.Errorf("a peers Service for one replica")
				}
			}
		}},
		{"ServiceMonitor scrapes the Service's metrics port", "", []string{"inferenceExtension.monitoring.prometheus.enabled=true", "inferenceExtension.monitoring.prometheus.extraLabels.release=prom"}, func(t *testing.T, objs []object) {
			var sm struct {
				header
				Spec struct {
					Selector struct {
						MatchLabels map[string]string `json:"matchLabels"`
					} `json:"selector"`
					NamespaceSelector struct {
						MatchNames []string `json:"matchNames"`
					} `json:"namespaceSelector"`
					Endpoints []struct {
						Port     string `json:"port"`
						Path     string `json:"path"`
						Interval string `json:"interval"`
					} `json:"endpoints"`
					JobLabel string `json:"jobLabel"`
				} `json:"spec"`
			}
			typed(t, objs, "ServiceMonitor", "", &sm)
			var svc corev1.Service
			typed(t, objs, "Service", "", &svc)
			for k, v := range sm.Spec.Selector.MatchLabels {
				if svc.Labels[k] != v {
					t.Errorf("ServiceMonitor selector %s=%s does not select the Service (labels %v)", k, v, svc.Labels)
				}
			}
			if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "http-metrics" || sm.Spec.Endpoints[0].Path != "/metrics" {
				t.Errorf("endpoints %+v", sm.Spec.Endpoints)
			}
			if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == sm.Spec.Endpoints[0].Port && p.Port == 9090 }) {
				t.Errorf("the Service has no port %q on 9090", sm.Spec.Endpoints[0].Port)
			}
			if !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{testNamespace}) || sm.Metadata.Labels["release"] != "prom" {
				t.Errorf("namespaceSelector %v, labels %v", sm.Spec.NamespaceSelector.MatchNames, sm.Metadata.Labels)
			}
		}},
		{"v1alpha2 pool", "", []string{"inferencePool.apiVersion=inference.networking.x-k8s.io/v1alpha2"}, func(t *testing.T, objs []object) {
			var pool struct {
				header
				Spec map[string]any `json:"spec"`
			}
			typed(t, objs, "InferencePool", testRelease, &pool)
			want := map[string]any{
				"selector":         map[string]any{"app": "vllm-llama"},
				"targetPortNumber": float64(8000),
				"extensionRef":     map[string]any{"kind": "Service", "name": "llama-epp", "portNumber": float64(9002), "failureMode": "FailClose"},
			}
			if pool.APIVersion != "inference.networking.x-k8s.io/v1alpha2" || !reflect.DeepEqual(pool.Spec, want) {
				t.Errorf("%s %v, want %v", pool.APIVersion, pool.Spec, want)
			}
			_, c := picker(t, objs)
			if v, _ := argValue(c.Args, "pool-group"); v != "inference.networking.x-k8s.io" {
				t.Errorf("--pool-group=%q", v)
			}
			var role rbacv1.Role
			typed(t, objs, "Role", "", &role)
			if got := ruleStrings(role.Rules); !slices.Contains(got, "inference.networking.x-k8s.io/inferencepools:get,list,watch") {
				t.Errorf("Role rules %v: want the alpha group's inferencepools", got)
			}
		}},
		{"several target ports", "inferencePool:\n  targetPorts: [{number: 8000}, {number: 8001}]\n", nil, func(t *testing.T, objs []object) {
			var pool inferencePool
			typed(t, objs, "InferencePool", testRelease, &pool)
			if len(pool.Spec.TargetPorts) != 2 || pool.Spec.TargetPorts[1].Number != 8001 {
				t.Errorf("targetPorts %+v", pool.Spec.TargetPorts)
			}
		}},
		{"the reference chart's EndpointPickerConfig file is passed as is", `inferenceExtension:
  pluginsConfigFile: custom-plugins.yaml
  pluginsCustomConfig:
    custom-plugins.yaml: |
      apiVersion: inference.networking.x-k8s.io/v1alpha1
      kind: EndpointPickerConfig
      plugins:
      - type: prefix-cache-scorer
      schedulingProfiles:
      - name: default
        plugins:
        - pluginRef: prefix-cache-scorer
`, nil, func(t *testing.T, objs []object) {
			_, c := picker(t, objs)
			if v, _ := argValue(c.Args, "config-file"); v != "/config/custom-plugins.yaml" {
				t.Errorf("--config-file=%q", v)
			}
			text := configFileText(t, objs, c)
			if !strings.Contains(text, "kind: EndpointPickerConfig") {
				t.Errorf("custom-plugins.yaml: %q", text)
			}
			if _, err := config.Parse([]byte(text)); err != nil {
				t.Errorf("the picker would refuse it: %v", err)
			}
		}},
		{"the reference's default file name means kvpick's config", "", []string{"inferenceExtension.pluginsConfigFile=default-plugins.yaml"}, func(t *testing.T, objs []object) {
			_, c := picker(t, objs)
			if v, _ := argValue(c.Args, "config-file"); v != "/config/config.yaml" {
				t.Errorf("--config-file=%q", v)
			}
		}},
		{"kvpick config and model server type reach config.yaml", "inferenceExtension:\n  config:\n    extProc:\n      fallbacks: 1\n", []string{"inferencePool.modelServerType=sglang"}, func(t *testing.T, objs []object) {
			_, c := picker(t, objs)
			cfg, err := config.Parse([]byte(configFileText(t, objs, c)))
			if err != nil {
				t.Fatal(err)
			}
			if cfg.ExtProc.Fallbacks != 1 || cfg.Pool.Metrics.Engine != "sglang" {
				t.Errorf("fallbacks %d, engine %q: want 1, sglang", cfg.ExtProc.Fallbacks, cfg.Pool.Metrics.Engine)
			}
		}},
		{"reference flags pass through", "", []string{"inferenceExtension.flags.v=3", "inferenceExtension.flags.zap-encoder=json"}, func(t *testing.T, objs []object) {
			_, c := picker(t, objs)
			if v, _ := argValue(c.Args, "v"); v != "3" {
				t.Errorf("--v=%q (args %v)", v, c.Args)
			}
			if v, _ := argValue(c.Args, "zap-encoder"); v != "json" {
				t.Errorf("--zap-encoder=%q", v)
			}
		}},
		{"drain settings reach the flags and the grace period", "", []string{"inferenceExtension.drainTimeoutSeconds=120", "inferenceExtension.shutdownDelaySeconds=10"}, func(t *testing.T, objs []object) {
			d, c := picker(t, objs)
			if v, _ := argValue(c.Args, "drain-timeout"); v != "120s" {
				t.Errorf("--drain-timeout=%q, want 120s", v)
			}
			checkGrace(t, d, c)
		}},
		{"a TLS Secret is mounted for --cert-path", "", []string{"inferenceExtension.tls.secretName=epp-cert"}, func(t *testing.T, objs []object) {
			d, c := picker(t, objs)
			dir, ok := argValue(c.Args, "cert-path")
			if !ok || !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == dir && m.Name == "tls" }) {
				t.Errorf("--cert-path=%q not mounted: %+v", dir, c.VolumeMounts)
			}
			if !slices.ContainsFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Secret != nil && v.Secret.SecretName == "epp-cert" }) {
				t.Error("no volume from Secret epp-cert")
			}
		}},
		{"HTTPRoute to the pool", "httpRoute:\n  enabled: true\n  parentRefs: [{name: inference-gateway}]\n", nil, func(t *testing.T, objs []object) {
			var r httpRoute
			typed(t, objs, "HTTPRoute", testRelease, &r)
			br := r.Spec.Rules[0].BackendRefs
			if len(br) != 1 || br[0].Group == nil || *br[0].Group != "inference.networking.k8s.io" || br[0].Kind != "InferencePool" || br[0].Name != testRelease {
				t.Errorf("backendRefs %+v", br)
			}
			if len(r.Spec.ParentRefs) != 1 || r.Spec.ParentRefs[0].Name != "inference-gateway" {
				t.Errorf("parentRefs %+v", r.Spec.ParentRefs)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.check(t, mustRender(t, tc.values, tc.sets...))
		})
	}
}

// TestChartConfigChangeRollsThePicker: Kubernetes does not restart pods for a ConfigMap change;
// the pod template's checksum must change with the configuration, and only with it.
func TestChartConfigChangeRollsThePicker(t *testing.T) {
	checksum := func(sets ...string) string {
		d, _ := picker(t, mustRender(t, "", sets...))
		return d.Spec.Template.Annotations["checksum/config"]
	}
	base := checksum()
	if base == "" {
		t.Fatal("no checksum/config annotation")
	}
	if got := checksum("inferenceExtension.replicas=1"); got != base {
		t.Error("checksum changed without a configuration change")
	}
	if got := checksum("inferenceExtension.config.extProc.fallbacks=1"); got == base {
		t.Error("checksum unchanged after a configuration change")
	}
}

// TestChartRefusesBadValues: mistakes stop `helm install` with a message naming the value.
func TestChartRefusesBadValues(t *testing.T) {
	tests := []struct {
		name   string
		values string
		sets   []string
		want   string
	}{
		{"no model servers", "", []string{"inferencePool.modelServers.matchLabels=null"}, "inferencePool.modelServers.matchLabels is required"},
		{"no image", "", []string{"inferenceExtension.image.hub="}, "make image IMAGE=<registry>/kvpick:<tag>"},
		{"a flag the chart sets", "", []string{"inferenceExtension.flags.pool-name=other"}, "the chart sets --pool-name itself"},
		{"the static pool flag", "", []string{"inferenceExtension.flags.endpoints=10.0.0.1:8000"}, "the pool comes from the InferencePool"},
		{"an unknown key", "", []string{"inferenceExtension.latencyPredictor.enabled=true"}, "latencyPredictor"},
		{"an unknown provider", "", []string{"provider.name=nginx"}, "provider"},
		{"an unread model server type", "", []string{"inferencePool.modelServerType=triton-tensorrt-llm"}, "modelServerType"},
		{"a config file that is not there", "", []string{"inferenceExtension.pluginsConfigFile=custom.yaml"}, `pluginsConfigFile "custom.yaml" is not a key`},
		{"the chart's config file name taken", "inferenceExtension:\n  pluginsCustomConfig:\n    config.yaml: x\n", nil, "the key config.yaml is the chart's"},
		{"several ports on an alpha pool", "inferencePool:\n  apiVersion: inference.networking.x-k8s.io/v1alpha2\n  targetPorts: [{number: 8000}, {number: 8001}]\n", nil, "takes one port"},
		{"nine target ports", "inferencePool:\n  targetPorts: [{number: 1}, {number: 2}, {number: 3}, {number: 4}, {number: 5}, {number: 6}, {number: 7}, {number: 8}, {number: 9}]\n", nil, "targetPorts"},
		{"a route without a gateway", "", []string{"httpRoute.enabled=true"}, "httpRoute.parentRefs is required"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := renderChart(t, tc.values, tc.sets...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("render error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

var flagArg = regexp.MustCompile(`^--([a-z0-9-]+)(=|$)`)

// TestChartFlagsExist: every flag the chart can pass is one the picker defines (read from its
// source), so that a rendered Deployment never crash-loops on "flag provided but not defined".
func TestChartFlagsExist(t *testing.T) {
	w := mustWorld(t)
	defs := w.binaries["kvpick"].flags
	for _, sets := range [][]string{
		nil,
		{"inferenceExtension.replicas=2"},
		{"inferenceExtension.tls.enabled=false"},
		{"inferenceExtension.tls.secretName=x"},
		{"inferenceExtension.flags.v=2", "inferenceExtension.flags.zap-encoder=json"},
	} {
		_, c := picker(t, mustRender(t, "", sets...))
		for _, a := range c.Args {
			m := flagArg.FindStringSubmatch(a)
			if m == nil {
				t.Errorf("%v: argument %q is not --flag[=value]", sets, a)
				continue
			}
			if _, ok := defs[m[1]]; !ok {
				t.Errorf("%v: --%s is not a flag of cmd/extproc", sets, m[1])
			}
		}
	}
}

// TestChartDefaultsMatchThePicker: the chart's drain settings are the picker's own defaults
// (config/default.yaml's shutdown section), so that the chart does not silently change its
// shutdown behaviour.
func TestChartDefaultsMatchThePicker(t *testing.T) {
	docs, err := parseDocs("config/default.yaml", config.DefaultYAML())
	if err != nil || len(docs) != 1 {
		t.Fatalf("config/default.yaml: %v", err)
	}
	_, c := picker(t, mustRender(t, ""))
	for flag, key := range map[string]string{"drain-timeout": "drainTimeout", "shutdown-delay": "delay"} {
		got, _ := argValue(c.Args, flag)
		def, _ := at(docs[0].Raw, "shutdown", key).(string)
		want, err := time.ParseDuration(def)
		if err != nil {
			t.Errorf("config/default.yaml shutdown.%s = %q: %v", key, def, err)
			continue
		}
		if g, err := time.ParseDuration(got); err != nil || g != want {
			t.Errorf("--%s=%q, the picker's default (shutdown.%s) is %v", flag, got, key, want)
		}
	}
}

// TestChartPassesTheManifestChecks runs the checks every kustomization passes (flags, ports,
// probes, configuration, references) on each rendered variant.
func TestChartPassesTheManifestChecks(t *testing.T) {
	w := mustWorld(t)
	for _, sets := range [][]string{
		nil,
		{"provider.name=istio"},
		{"provider.name=gke"},
		{"inferenceExtension.replicas=2"},
		{"inferenceExtension.monitoring.prometheus.enabled=true"},
		{"httpRoute.enabled=true", "httpRoute.parentRefs[0].name=gw"},
	} {
		t.Run(fmt.Sprint(sets), func(t *testing.T) {
			for _, err := range checkSet(w, mustRender(t, "", sets...), checkOptions{}) {
				t.Error(err)
			}
		})
	}
}
