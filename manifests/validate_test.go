package manifests

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func mustWorld(t *testing.T) *world {
	t.Helper()
	w, err := loadWorld()
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// optionsFor: the e2e deployment must carry its own model servers; the base, made for any
// cluster, selects the user's.
func optionsFor(dir string) checkOptions {
	return checkOptions{poolMembers: filepath.Base(dir) == "e2e"}
}

// TestManifests builds every kustomization under manifests/ as `kubectl apply -k` would and
// checks its objects against the binaries' source. Components are built inside an overlay
// (TestHAComponent).
func TestManifests(t *testing.T) {
	w := mustWorld(t)
	dirs, err := kustomizations(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"base", "e2e", "gateways/envoy-gateway", "gateways/envoy-gateway/cluster", "gateways/istio", "gateways/kgateway", "components/ha", "components/active-active"} {
		if !slices.Contains(dirs, filepath.FromSlash(want)) {
			t.Errorf("no kustomization in manifests/%s", want)
		}
	}
	for _, dir := range dirs {
		if isComponent(t, dir) {
			continue
		}
		t.Run(filepath.ToSlash(dir), func(t *testing.T) {
			objs, err := build(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(objs) == 0 {
				t.Fatal("no objects")
			}
			for _, err := range checkSet(w, objs, optionsFor(dir)) {
				t.Error(err)
			}
		})
	}
}

func kustomizationFile(t *testing.T, dir string) map[string]any {
	t.Helper()
	objs, err := loadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil || len(objs) != 1 {
		t.Fatalf("%s/kustomization.yaml: %v", dir, err)
	}
	return objs[0].Raw
}

func isComponent(t *testing.T, dir string) bool {
	return kustomizationFile(t, dir)["kind"] == "Component"
}

// haOverlay builds base + components/ha as an overlay would.
func haOverlay(t *testing.T) []object { return componentOverlay(t, "ha") }

// componentOverlay builds base + components/<name> as an overlay would.
func componentOverlay(t *testing.T, name string) []object {
	t.Helper()
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// kustomize takes relative paths only.
	rel := func(p string) string {
		r, err := filepath.Rel(dir, filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- " + rel("base") +
		"\ncomponents:\n- " + rel(filepath.Join("components", name)) + "\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	objs, err := build(dir)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestHAComponent builds base + components/ha as an overlay would and checks that it turns
// leader election on with what it needs: the flag, replicas, Recreate and Lease access (the
// RBAC check of checkSet refuses leader election without it).
func TestHAComponent(t *testing.T) {
	w := mustWorld(t)
	objs := haOverlay(t)
	for _, err := range checkSet(w, objs, checkOptions{}) {
		t.Error(err)
	}
	var d deployment
	for _, o := range objs {
		if o.Kind() == "Deployment" {
			if err := o.decode(&d); err != nil {
				t.Fatal(err)
			}
		}
	}
	c := d.Spec.Template.Spec.Containers[0]
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 || !slices.Contains(c.Args, "--ha-enable-leader-election") ||
		at(d.Spec.Strategy, "type") != "Recreate" {
		t.Errorf("replicas %v, strategy %v, args %v: want 2 replicas, Recreate and --ha-enable-leader-election", d.Spec.Replicas, d.Spec.Strategy, c.Args)
	}
	// Without the Role's Lease rule the checks must object.
	for _, o := range objs {
		if o.Kind() == "Role" {
			rules := o.Raw["rules"].([]any)
			o.Raw["rules"] = rules[:len(rules)-1]
		}
	}
	errs := checkSet(w, objs, checkOptions{})
	if !slices.ContainsFunc(errs, func(e error) bool { return strings.Contains(e.Error(), "coordination.k8s.io/leases") }) {
		t.Errorf("leader election without Lease access passed the checks: %v", errs)
	}
}

// TestActiveActiveComponent builds base + components/active-active: two replicas, no leader
// election, --peers naming a headless Service over the picker pods' metrics port.
func TestActiveActiveComponent(t *testing.T) {
	w := mustWorld(t)
	objs := componentOverlay(t, "active-active")
	for _, err := range checkSet(w, objs, checkOptions{}) {
		t.Error(err)
	}
	var d deployment
	var peersSvc map[string]any
	for _, o := range objs {
		switch {
		case o.Kind() == "Deployment":
			if err := o.decode(&d); err != nil {
				t.Fatal(err)
			}
		case o.Kind() == "Service" && o.Name() == "kvpick-epp-peers":
			peersSvc = o.Raw
		}
	}
	c := d.Spec.Template.Spec.Containers[0]
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 || slices.Contains(c.Args, "--ha-enable-leader-election") ||
		!slices.Contains(c.Args, "--peers=kvpick-epp-peers:9090") {
		t.Errorf("replicas %v, args %v: want 2 replicas, --peers, no leader election", d.Spec.Replicas, c.Args)
	}
	if peersSvc == nil || at(peersSvc, "spec", "clusterIP") != "None" || at(peersSvc, "spec", "publishNotReadyAddresses") != true ||
		at(peersSvc, "spec", "selector", "app.kubernetes.io/name") != "kvpick" {
		t.Errorf("peers Service %v: want headless, not-ready pods included, the picker's pods", peersSvc)
	}
}

// Files under manifests/ that are not Kubernetes objects for kustomize: the Helm chart, the
// plain Envoy bootstrap, Helm values for a gateway's own chart, the pinned versions, the tests'
// data.
func notKustomized(p string) bool {
	p = filepath.ToSlash(p)
	return strings.HasPrefix(p, "charts/") || strings.HasPrefix(p, "envoy/") || strings.HasPrefix(p, "testdata/") ||
		strings.HasSuffix(p, "helm-values.yaml") || p == "versions.yaml"
}

// TestEveryManifestIsInAKustomization: kustomize applies only what a kustomization names, so a
// YAML file beside a kustomization.yaml that it does not name (as a resource, a generator's
// file or a patch) would silently never be applied.
func TestEveryManifestIsInAKustomization(t *testing.T) {
	listed := map[string]bool{}
	dirs, err := kustomizations(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		k := kustomizationFile(t, d)
		var names []string
		for _, key := range []string{"resources", "components"} {
			for _, r := range asList(k[key]) {
				names = append(names, fmt.Sprint(r))
			}
		}
		for _, g := range asList(k["configMapGenerator"]) {
			for _, f := range asList(at(g, "files")) {
				names = append(names, fmt.Sprint(f))
			}
		}
		for _, p := range asList(k["patches"]) {
			if path, ok := at(p, "path").(string); ok {
				names = append(names, path)
			}
		}
		for _, n := range names {
			listed[filepath.Join(d, n)] = true
		}
		listed[filepath.Join(d, "kustomization.yaml")] = true
	}
	err = filepath.WalkDir(".", func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if ext := filepath.Ext(p); (ext == ".yaml" || ext == ".yml") && !notKustomized(p) && !listed[p] {
			t.Errorf("%s: no kustomization names it, so it is never applied", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func asList(v any) []any { l, _ := v.([]any); return l }

// TestGatewayWiring checks references across kustomizations: each Gateway's class exists, and
// the class's parameters (Envoy Gateway's EnvoyProxy) exist where it says.
func TestGatewayWiring(t *testing.T) {
	dirs, err := kustomizations(".")
	if err != nil {
		t.Fatal(err)
	}
	classes := map[string]*gatewayClass{}
	proxies := map[string]bool{}
	var gateways []*gateway
	for _, dir := range dirs {
		objs, err := build(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			switch o.Kind() {
			case "GatewayClass":
				var c gatewayClass
				if err := o.decode(&c); err != nil {
					t.Fatal(err)
				}
				classes[c.Metadata.Name] = &c
			case "EnvoyProxy":
				proxies[o.Namespace()+"/"+o.Name()] = true
			case "Gateway":
				var g gateway
				if err := o.decode(&g); err != nil {
					t.Fatal(err)
				}
				gateways = append(gateways, &g)
			}
		}
	}
	if len(gateways) == 0 {
		t.Fatal("no Gateway in manifests/")
	}
	// Classes the gateways' own installs create (docs/deploy.md): Istio's and agentgateway's.
	installed := map[string]bool{"istio": true, "agentgateway": true}
	for _, g := range gateways {
		c := classes[g.Spec.GatewayClassName]
		if c == nil && installed[g.Spec.GatewayClassName] {
			continue
		}
		if c == nil {
			t.Errorf("Gateway %q: GatewayClass %q is not defined under manifests/", g.Metadata.Name, g.Spec.GatewayClassName)
			continue
		}
		if c.Spec.ControllerName != "gateway.envoyproxy.io/gatewayclass-controller" {
			t.Errorf("GatewayClass %q: controllerName %q, want Envoy Gateway's", c.Metadata.Name, c.Spec.ControllerName)
		}
		if pr := c.Spec.ParametersRef; pr != nil {
			if pr.Kind != "EnvoyProxy" || pr.Group == nil || *pr.Group != "gateway.envoyproxy.io" || pr.Namespace == "" {
				t.Errorf("GatewayClass %q: parametersRef must name a namespaced gateway.envoyproxy.io EnvoyProxy", c.Metadata.Name)
			} else if !proxies[pr.Namespace+"/"+pr.Name] {
				t.Errorf("GatewayClass %q: EnvoyProxy %s/%s is not defined under manifests/", c.Metadata.Name, pr.Namespace, pr.Name)
			}
		}
	}
}

// TestBinaryFlags guards the readers the checks depend on: the picker's flags from its -h, with
// their defaults, the reference chart's flags it accepts, and the simulator's from its source.
func TestBinaryFlags(t *testing.T) {
	w := mustWorld(t)
	flags := w.binaries["kvpick"].flags
	for name, want := range map[string]flagDef{
		"grpc-port":                 {Type: "int", Default: "9002"},
		"grpc-health-port":          {Type: "int", Default: "9003"},
		"metrics-port":              {Type: "int", Default: "9090"},
		"config-file":               {Type: "string"},
		"endpoints":                 {Type: "string"},
		"secure-serving":            {Type: "bool", Default: "true"},
		"cert-path":                 {Type: "string"},
		"log-level":                 {Type: "string", Default: "info"},
		"pool-name":                 {Type: "string"},
		"pool-group":                {Type: "string", Default: "inference.networking.k8s.io"},
		"ha-enable-leader-election": {Type: "bool"},
		"v":                         {Type: "string"},
		"zap-encoder":               {Type: "string"},
	} {
		if got, ok := flags[name]; !ok || got != want {
			t.Errorf("--%s: got %+v (defined %v), want %+v", name, got, ok, want)
		}
	}
	if got := flags["drain-timeout"]; got.Type != "duration" || got.Default == "" {
		t.Errorf("--drain-timeout: %+v, want a duration with a default", got)
	}
	if got := w.binaries["simserver"].flags["addr"]; got.Type != "string" {
		t.Errorf("simserver --addr: %+v", got)
	}
}

func TestParseHelp(t *testing.T) {
	got := parseHelp(`Usage of extproc:
  -cert-path string
    	directory holding tls.crt and tls.key
  -drain-timeout duration
    	on SIGTERM, how long open streams get to end (default 5m0s)
  -grpc-port int
    	ext_proc gRPC port (default 9002)
  -ha-enable-leader-election
    	active-passive HA
  -log-level string
    	log level (default "info")
  -tracing value
    	accepted and ignored
`)
	want := map[string]flagDef{
		"cert-path":                 {Type: "string"},
		"drain-timeout":             {Type: "duration", Default: "5m0s"},
		"grpc-port":                 {Type: "int", Default: "9002"},
		"ha-enable-leader-election": {Type: "bool"},
		"log-level":                 {Type: "string", Default: "info"},
		"tracing":                   {Type: "string"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseHelp: %v, want %v", got, want)
	}
}

// The negative tests: each breaks one thing in the e2e set and expects the checks to say so.

func e2eSet(t *testing.T) []object {
	t.Helper()
	objs, err := build("e2e")
	if err != nil {
		t.Fatal(err)
	}
	// A deep copy through JSON, so that edits never leak between cases.
	var out []object
	for _, o := range objs {
		b, err := json.Marshal(o.Raw)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		out = append(out, object{Source: o.Source, Raw: m})
	}
	return out
}

func find(t *testing.T, objs []object, kind, name string) map[string]any {
	t.Helper()
	for _, o := range objs {
		// ConfigMaps from a configMapGenerator carry a hash suffix.
		if o.Kind() == kind && (o.Name() == name || kind == "ConfigMap" && strings.HasPrefix(o.Name(), name+"-")) {
			return o.Raw
		}
	}
	t.Fatalf("no %s %q in the e2e set", kind, name)
	return nil
}

func containerOf(t *testing.T, objs []object, deploy string) map[string]any {
	t.Helper()
	c, ok := at(find(t, objs, "Deployment", deploy), "spec", "template", "spec", "containers", 0).(map[string]any)
	if !ok {
		t.Fatalf("Deployment %q has no container", deploy)
	}
	return c
}

func replaceArg(t *testing.T, c map[string]any, old, new string) {
	t.Helper()
	args, _ := c["args"].([]any)
	for i, a := range args {
		if a == old {
			args[i] = new
			return
		}
	}
	t.Fatalf("no arg %q in %v", old, args)
}

func appendArg(c map[string]any, arg string) {
	args, _ := c["args"].([]any)
	c["args"] = append(args, arg)
}

func TestChecksCatchBrokenManifests(t *testing.T) {
	w := mustWorld(t)
	if errs := checkSet(w, e2eSet(t), checkOptions{poolMembers: true}); len(errs) > 0 {
		t.Fatalf("the unedited e2e set must pass: %v", errs)
	}
	tests := []struct {
		name string
		edit func(t *testing.T, objs []object)
		want string
	}{
		{"unknown picker flag", func(t *testing.T, o []object) {
			replaceArg(t, containerOf(t, o, "kvpick"), "--grpc-port=9002", "--grpc-prot=9002")
		}, `unknown flag "--grpc-prot"`},
		{"unknown simulator flag", func(t *testing.T, o []object) {
			replaceArg(t, containerOf(t, o, "kvpick-sim"), "--decode-ms-per-token=20", "--decode-ms-per-tokn=20")
		}, `unknown flag "--decode-ms-per-tokn"`},
		{"flag value of the wrong type", func(t *testing.T, o []object) {
			replaceArg(t, containerOf(t, o, "kvpick"), "--metrics-port=9090", "--metrics-port=metrics")
		}, `flag --metrics-port: invalid int value "metrics"`},
		{"flag moved off its declared port", func(t *testing.T, o []object) {
			replaceArg(t, containerOf(t, o, "kvpick"), "--metrics-port=9090", "--metrics-port=9091")
		}, "listens on 9091"},
		{"env reference without env", func(t *testing.T, o []object) {
			containerOf(t, o, "kvpick")["env"] = []any{}
		}, "$(NAMESPACE), which is not in env"},
		{"wrong readiness service", func(t *testing.T, o []object) {
			at(containerOf(t, o, "kvpick"), "readinessProbe", "grpc").(map[string]any)["service"] = "ready"
		}, `readinessProbe: gRPC service "ready", want "readiness"`},
		{"liveness probe on the ext_proc port", func(t *testing.T, o []object) {
			at(containerOf(t, o, "kvpick"), "livenessProbe", "grpc").(map[string]any)["port"] = 9002
		}, "livenessProbe: gRPC port 9002, want 9003"},
		{"HTTP readiness probe for the picker", func(t *testing.T, o []object) {
			containerOf(t, o, "kvpick")["readinessProbe"] = map[string]any{"httpGet": map[string]any{"path": "/health", "port": 9090}}
		}, "readinessProbe must be a gRPC probe"},
		{"simulator probe on a port it does not serve", func(t *testing.T, o []object) {
			at(containerOf(t, o, "kvpick-sim"), "readinessProbe", "httpGet").(map[string]any)["port"] = "metrics"
		}, "readinessProbe: port metrics"},
		{"service targetPort typo", func(t *testing.T, o []object) {
			at(find(t, o, "Service", "kvpick-epp"), "spec", "ports", 0).(map[string]any)["targetPort"] = "grcp"
		}, "targetPort grcp is not a container port"},
		{"ext_proc service port without http2", func(t *testing.T, o []object) {
			delete(at(find(t, o, "Service", "kvpick-epp"), "spec", "ports", 0).(map[string]any), "appProtocol")
		}, "appProtocol must be http2"},
		{"pool points at the health port", func(t *testing.T, o []object) {
			at(find(t, o, "InferencePool", "kvpick-pool"), "spec", "endpointPickerRef", "port").(map[string]any)["number"] = 9003
		}, `Service "kvpick-epp" has no port 9003`},
		{"pool points at the metrics port", func(t *testing.T, o []object) {
			at(find(t, o, "InferencePool", "kvpick-pool"), "spec", "endpointPickerRef", "port").(map[string]any)["number"] = 9090
		}, "does not reach a picker's ext_proc port"},
		{"pool names a missing service", func(t *testing.T, o []object) {
			at(find(t, o, "InferencePool", "kvpick-pool"), "spec", "endpointPickerRef").(map[string]any)["name"] = "kvpick"
		}, `Service "kvpick", which is not in this set`},
		{"pool selects no model servers", func(t *testing.T, o []object) {
			at(find(t, o, "InferencePool", "kvpick-pool"), "spec", "selector").(map[string]any)["matchLabels"] = map[string]any{"app": "vllm"}
		}, "selects no model server pod"},
		{"pool target port the servers do not open", func(t *testing.T, o []object) {
			at(find(t, o, "InferencePool", "kvpick-pool"), "spec", "targetPorts", 0).(map[string]any)["number"] = 8080
		}, "targetPorts 8080 is not a container port"},
		{"bad failure mode", func(t *testing.T, o []object) {
			at(find(t, o, "InferencePool", "kvpick-pool"), "spec", "endpointPickerRef").(map[string]any)["failureMode"] = "FailClosed"
		}, `failureMode "FailClosed"`},
		{"route to a missing pool", func(t *testing.T, o []object) {
			at(find(t, o, "HTTPRoute", "kvpick-route"), "spec", "rules", 0, "backendRefs", 0).(map[string]any)["name"] = "pool"
		}, `backendRef InferencePool "pool" is not in this set`},
		{"route to a missing gateway", func(t *testing.T, o []object) {
			at(find(t, o, "HTTPRoute", "kvpick-route"), "spec", "parentRefs", 0).(map[string]any)["name"] = "gw"
		}, `parentRef Gateway "gw"`},
		{"invalid picker configuration", func(t *testing.T, o []object) {
			find(t, o, "ConfigMap", "kvpick-config")["data"] = map[string]any{"config.yaml": "extProc:\n  chunkBytes: 10\n"}
		}, "extProc.chunkBytes 10"},
		{"unknown configuration field", func(t *testing.T, o []object) {
			find(t, o, "ConfigMap", "kvpick-config")["data"] = map[string]any{"config.yaml": "pool:\n  endpoint: []\n"}
		}, `unknown field "endpoint"`},
		{"config file not in the ConfigMap", func(t *testing.T, o []object) {
			replaceArg(t, containerOf(t, o, "kvpick"), "--config-file=/config/config.yaml", "--config-file=/config/kvpick.yaml")
		}, `has no key "kvpick.yaml"`},
		{"misspelt field", func(t *testing.T, o []object) {
			c := containerOf(t, o, "kvpick")
			c["readinesProbe"] = c["readinessProbe"]
			delete(c, "readinessProbe")
		}, `unknown field "readinesProbe"`},
		{"missing name", func(t *testing.T, o []object) {
			delete(find(t, o, "HTTPRoute", "kvpick-route")["metadata"].(map[string]any), "name")
		}, "metadata.name are required"},
		{"writable root filesystem", func(t *testing.T, o []object) {
			at(containerOf(t, o, "kvpick"), "securityContext").(map[string]any)["readOnlyRootFilesystem"] = false
		}, "readOnlyRootFilesystem must be true"},
		{"selector the pods do not carry", func(t *testing.T, o []object) {
			at(find(t, o, "Deployment", "kvpick"), "spec", "selector").(map[string]any)["matchLabels"] = map[string]any{"app": "x"}
		}, "does not match the pod template's labels"},
		{"static pool beside the InferencePool", func(t *testing.T, o []object) {
			appendArg(containerOf(t, o, "kvpick"), "--endpoints=10.0.0.1:8000")
		}, "--pool-name and --endpoints are exclusive"},
		{"static endpoint that is not ip:port", func(t *testing.T, o []object) {
			appendArg(containerOf(t, o, "kvpick"), "--endpoints=sim-0:8000")
		}, `"sim-0:8000" is not ip:port`},
		{"picker serving a pool that is not there", func(t *testing.T, o []object) {
			replaceArg(t, containerOf(t, o, "kvpick"), "--pool-name=kvpick-pool", "--pool-name=llama")
		}, "--pool-name=llama names no InferencePool"},
		{"grace period shorter than the drain", func(t *testing.T, o []object) {
			at(find(t, o, "Deployment", "kvpick"), "spec", "template", "spec").(map[string]any)["terminationGracePeriodSeconds"] = 30
		}, "shorter than the picker's shutdown delay + drain timeout"},
		{"no right to read pods", func(t *testing.T, o []object) {
			r := find(t, o, "Role", "kvpick")
			r["rules"] = r["rules"].([]any)[1:]
		}, `may not list /pods`},
		{"binding to another service account", func(t *testing.T, o []object) {
			at(find(t, o, "RoleBinding", "kvpick"), "subjects", 0).(map[string]any)["name"] = "default"
		}, `service account "kvpick" may not watch inference.networking.k8s.io/inferencepools`},
		{"no token to watch with", func(t *testing.T, o []object) {
			at(find(t, o, "Deployment", "kvpick"), "spec", "template", "spec").(map[string]any)["automountServiceAccountToken"] = false
		}, "automountServiceAccountToken is false"},
		{"unknown kind", func(t *testing.T, o []object) {
			find(t, o, "ServiceAccount", "kvpick")["kind"] = "ServiceAcount"
		}, "no schema for v1/ServiceAcount"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := e2eSet(t)
			tc.edit(t, objs)
			errs := checkSet(w, objs, checkOptions{poolMembers: true})
			for _, err := range errs {
				if strings.Contains(err.Error(), tc.want) {
					return
				}
			}
			t.Errorf("no error mentions %q; got %v", tc.want, errs)
		})
	}
}

func TestBrokenDocumentsAreRefused(t *testing.T) {
	if _, err := parseDocs("bad.yaml", []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x\n")); err == nil {
		t.Error("unterminated flow mapping: no error")
	}
	if _, err := parseDocs("dup.yaml", []byte("apiVersion: v1\nkind: ConfigMap\nkind: Service\n")); err == nil {
		t.Error("duplicate key: no error")
	}
	if _, err := parseDocs("list.yaml", []byte("- a\n- b\n")); err == nil {
		t.Error("a list document: no error")
	}
	objs, err := parseDocs("two.yaml", []byte("# comment only\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n---\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: b\n"))
	if err != nil || len(objs) != 2 || objs[1].Name() != "b" {
		t.Errorf("multi-document stream: %v, %v", objs, err)
	}
}
