package manifests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kvpick/kvpick/config"
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

// TestManifests builds every kustomization under manifests/ as kubectl apply -k would and
// checks its objects against the binaries' source.
func TestManifests(t *testing.T) {
	w := mustWorld(t)
	dirs, err := kustomizations(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"base", "e2e", "envoy-gateway", filepath.Join("envoy-gateway", "cluster")} {
		found := false
		for _, d := range dirs {
			found = found || d == want
		}
		if !found {
			t.Errorf("no kustomization in manifests/%s", want)
		}
	}
	for _, dir := range dirs {
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

// TestEveryManifestIsInAKustomization: a YAML file under manifests/ that no kustomization
// lists would never be applied (envoy/ holds an Envoy bootstrap, not Kubernetes objects).
func TestEveryManifestIsInAKustomization(t *testing.T) {
	dirs, err := kustomizations(".")
	if err != nil {
		t.Fatal(err)
	}
	inKustomization := map[string]bool{}
	for _, d := range dirs {
		inKustomization[d] = true
	}
	err = filepath.WalkDir(".", func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		dir := filepath.Dir(p)
		if ext := filepath.Ext(p); (ext == ".yaml" || ext == ".yml") && dir != "envoy" && !inKustomization[dir] {
			t.Errorf("%s: not in a kustomization directory", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

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
	for _, g := range gateways {
		c := classes[g.Spec.GatewayClassName]
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

// TestConfigMapMatchesDefaults: the base ConfigMap is documented as a copy of
// config/default.yaml; it must say the same thing (comments and order aside).
func TestConfigMapMatchesDefaults(t *testing.T) {
	objs, err := loadFile(filepath.Join("base", "configmap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cm configMap
	if len(objs) != 1 || objs[0].decode(&cm) != nil || cm.Metadata.Name != "kvpick-config" {
		t.Fatalf("base/configmap.yaml: want one ConfigMap kvpick-config")
	}
	text, ok := cm.Data["config.yaml"]
	if !ok {
		t.Fatal("ConfigMap kvpick-config has no config.yaml")
	}
	got, err := config.Parse([]byte(text))
	if err != nil {
		t.Fatalf("config.Parse: %v", err)
	}
	if !reflect.DeepEqual(normalize(t, got), normalize(t, config.Default())) {
		t.Errorf("manifests/base/configmap.yaml no longer matches config/default.yaml: run hack/gen-configmap.sh")
	}
}

// normalize turns a configuration into plain values, so that plugin parameters compare by
// value rather than by their JSON text.
func normalize(t *testing.T, c *config.Config) any {
	t.Helper()
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestBinaryFlagsFromSource guards the AST reader the checks depend on: it must find the
// picker's documented flags with their defaults.
func TestBinaryFlagsFromSource(t *testing.T) {
	w := mustWorld(t)
	flags := w.binaries["extproc"].flags
	for name, want := range map[string]flagDef{
		"grpc-port":        {Type: "int", Default: "9002"},
		"grpc-health-port": {Type: "int", Default: "9003"},
		"metrics-port":     {Type: "int", Default: "9090"},
		"config-file":      {Type: "string"},
		"endpoints":        {Type: "string"},
		"secure-serving":   {Type: "bool", Default: "true"},
		"cert-path":        {Type: "string"},
		"log-level":        {Type: "string", Default: "info"},
	} {
		if got, ok := flags[name]; !ok || got != want {
			t.Errorf("--%s: got %+v (defined %v), want %+v", name, got, ok, want)
		}
	}
	if got := w.binaries["simserver"].flags["addr"]; got.Type != "string" {
		t.Errorf("simserver --addr: %+v", got)
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
		if o.Kind() == kind && o.Name() == name {
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
		}, "$(KVPICK_ENDPOINTS), which is not in env"},
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
			replaceArg(t, containerOf(t, o, "kvpick"), "--config-file=/etc/kvpick/config.yaml", "--config-file=/etc/kvpick/kvpick.yaml")
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
		{"static endpoint that is not ip:port", func(t *testing.T, o []object) {
			replaceArg(t, containerOf(t, o, "kvpick"), "--endpoints=$(KVPICK_ENDPOINTS)", "--endpoints=sim-0:8000")
		}, `"sim-0:8000" is not ip:port`},
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

func TestKustomizationMistakesAreRefused(t *testing.T) {
	write := func(t *testing.T, dir string, files map[string]string) {
		t.Helper()
		for name, text := range files {
			p := filepath.Join(dir, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	const head = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
	const ns = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n"
	const class = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata:\n  name: c\nspec:\n  controllerName: x/y\n"
	tests := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"missing resource", map[string]string{"kustomization.yaml": head + "resources: [gone.yaml]\n"}, "gone.yaml"},
		{"unlisted file", map[string]string{"kustomization.yaml": head + "resources: [a.yaml]\n", "a.yaml": ns, "b.yaml": ns}, "b.yaml is not listed"},
		{"unmodelled field", map[string]string{"kustomization.yaml": head + "namePrefix: x-\nresources: [a.yaml]\n", "a.yaml": ns}, "namePrefix"},
		{"cluster-scoped custom kind under a namespace", map[string]string{"kustomization.yaml": head + "namespace: ns1\nresources: [c.yaml]\n", "c.yaml": class}, "cluster-scoped"},
		{"image that matches nothing", map[string]string{"kustomization.yaml": head + "resources: [a.yaml]\nimages:\n- name: ghcr.io/kvpick/extproc\n  newTag: x\n", "a.yaml": ns}, "matches no container image"},
		{"remote resource", map[string]string{"kustomization.yaml": head + "resources: [https://example.com/x.yaml]\n"}, "remote resource"},
		{"broken YAML in a resource", map[string]string{"kustomization.yaml": head + "resources: [a.yaml]\n", "a.yaml": "kind: [\n"}, "not valid YAML"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, tc.files)
			_, err := build(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("build: %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
	// And a namespaced overlay does set the namespace.
	dir := t.TempDir()
	write(t, dir, map[string]string{
		"kustomization.yaml":      head + "namespace: ns1\nresources: [base]\n",
		"base/kustomization.yaml": head + "resources: [s.yaml]\n",
		"base/s.yaml":             "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: s\n",
	})
	objs, err := build(dir)
	if err != nil || len(objs) != 1 || objs[0].Namespace() != "ns1" {
		t.Errorf("overlay namespace: %v %v", objs, err)
	}
}
