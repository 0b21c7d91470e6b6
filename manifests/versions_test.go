package manifests

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// versionQuotes are the ways the docs and scripts quote a pinned version, by versions.yaml key.
var versionQuotes = map[string][]*regexp.Regexp{
	"gatewayAPI": {
		regexp.MustCompile(`kubernetes-sigs/gateway-api/releases/download/(v[0-9.]+)/`),
		regexp.MustCompile(`Gateway API (v[0-9][0-9.]*[0-9])`),
	},
	"inferenceExtension": {
		regexp.MustCompile(`gateway-api-inference-extension/releases/download/(v[0-9.]+)/`),
		regexp.MustCompile(`Inference Extension (v[0-9][0-9.]*[0-9])`),
	},
	"envoyGateway": {
		regexp.MustCompile(`envoyproxy/gateway-(?:crds-)?helm --version (v[0-9.]+)`),
		regexp.MustCompile(`Envoy Gateway (v[0-9][0-9.]*[0-9])`),
	},
	"envoyAIGateway": {
		regexp.MustCompile(`envoyproxy/ai-gateway-(?:crds-)?helm --version (v[0-9.]+)`),
		regexp.MustCompile(`Envoy AI Gateway (v[0-9][0-9.]*[0-9])`),
	},
	"istio": {
		regexp.MustCompile(`istioctl ([0-9]+\.[0-9]+\.[0-9]+)`),
		regexp.MustCompile(`Istio ([0-9]+\.[0-9]+\.[0-9]+)`),
	},
	"agentgateway": {
		regexp.MustCompile(`charts/agentgateway(?:-crds)? --version (v[0-9.]+)`),
		regexp.MustCompile(`agentgateway (v[0-9][0-9.]*[0-9])`),
	},
	"kubernetes": {
		regexp.MustCompile(`kube-apiserver (v[0-9][0-9.]*[0-9])`),
		regexp.MustCompile(`KUBE_VERSION=\$\{KUBE_VERSION:-(v[0-9.]+)\}`),
	},
}

// TestVersionsAreStatedOnce: every version the docs and scripts quote is versions.yaml's, and
// the deployment guide quotes each gateway's (so that this test cannot pass on a page that
// quotes none).
func TestVersionsAreStatedOnce(t *testing.T) {
	pinned := versions(t)
	for key := range versionQuotes {
		if pinned[key] == "" {
			t.Errorf("versions.yaml has no %s", key)
		}
	}
	for key := range pinned {
		if versionQuotes[key] == nil {
			t.Errorf("versions.yaml: %s: no quote pattern in versions_test.go", key)
		}
	}
	files := []string{"../docs/deploy.md", "../e2e/kind/README.md", "../hack/e2e-kind.sh", "../hack/kube-binaries.sh", "README.md"}
	quoted := map[string]map[string]bool{} // file -> keys
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		quoted[f] = map[string]bool{}
		for key, res := range versionQuotes {
			for _, re := range res {
				for _, m := range re.FindAllStringSubmatch(string(b), -1) {
					quoted[f][key] = true
					if m[1] != pinned[key] {
						t.Errorf("%s: %q quotes %s %s; manifests/versions.yaml pins %s", f, m[0], key, m[1], pinned[key])
					}
				}
			}
		}
	}
	for _, key := range []string{"gatewayAPI", "inferenceExtension", "envoyGateway", "envoyAIGateway", "istio", "agentgateway"} {
		if !quoted["../docs/deploy.md"][key] {
			t.Errorf("docs/deploy.md quotes no %s version", key)
		}
	}
	// The kind suite reads the versions instead of pinning its own.
	script, err := os.ReadFile("../hack/e2e-kind.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(script), "manifests/versions.yaml") {
		t.Error("hack/e2e-kind.sh does not read manifests/versions.yaml")
	}
}

var (
	docMetric = regexp.MustCompile(`kvpick_[a-z_]*`)
	srcMetric = regexp.MustCompile(`"(kvpick_[a-z_]*[a-z])"`)
)

// TestDeployGuideMetricsExist: every metric the deployment guide tells users to watch is one
// the picker exports (a string literal in pkg/), so a rename cannot leave the guide stale.
func TestDeployGuideMetricsExist(t *testing.T) {
	exported := map[string]bool{}
	err := filepath.WalkDir("../pkg", func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range srcMetric.FindAllStringSubmatch(string(b), -1) {
			exported[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(exported) < 10 {
		t.Fatalf("found only %d metric names in pkg/: the pattern is out of date", len(exported))
	}
	doc, err := os.ReadFile("../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	names := docMetric.FindAllString(string(doc), -1)
	if len(names) == 0 {
		t.Fatal("docs/deploy.md names no metric")
	}
	for _, n := range slices.Compact(slices.Sorted(slices.Values(names))) {
		// A family named by its prefix (kvpick_pool_) is checked through its members.
		if !exported[n] && !strings.HasSuffix(n, "_") {
			t.Errorf("docs/deploy.md names %s, which pkg/ does not export", n)
		}
	}
}
