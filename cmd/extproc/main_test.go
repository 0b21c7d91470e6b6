package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBadFlagsAndConfigNameTheProblem(t *testing.T) {
	dir := t.TempDir()
	badCfg := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(badCfg, []byte("extProc:\n  chunkBytes: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	unknownPlugin := filepath.Join(dir, "plugin.yaml")
	if err := os.WriteFile(unknownPlugin, []byte("plugins:\n- name: magic-scorer\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	staticCfg := filepath.Join(dir, "static.yaml")
	if err := os.WriteFile(staticCfg, []byte("pool:\n  endpoints: [10.0.0.1:8000]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	free := []string{"--grpc-port", "0", "--grpc-health-port", "0", "--metrics-port", "0"}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"static pool flag and Kubernetes", []string{"--endpoints", "10.0.0.1:8000", "--pool-name", "p"}, "exclusive"},
		{"static pool in the config and Kubernetes", []string{"--config-file", staticCfg, "--pool-name", "p"}, "exclusive"},
		{"leader election without a pool", []string{"--ha-enable-leader-election"}, "need --pool-name"},
		{"unknown pool group", append([]string{"--pool-name", "p", "--pool-group", "inference.example.com"}, free...), "--pool-group"},
		{"unreadable kubeconfig", append([]string{"--pool-name", "p", "--kubeconfig", filepath.Join(dir, "none.kubeconfig")}, free...), "none.kubeconfig"},
		{"reference flag this picker refuses", []string{"--endpoint-selector", "app=vllm"}, "--endpoint-selector"},
		{"bad drain timeout", []string{"--drain-timeout", "0s"}, "drainTimeout"},
		{"unknown flag", []string{"--grpc-prot", "1"}, "grpc-prot"},
		{"port out of range", []string{"--metrics-port", "70000"}, "--metrics-port"},
		{"bad metrics bind address", []string{"--metrics-bind-address", "localhost"}, "--metrics-bind-address"},
		{"bad log level", []string{"--log-level", "loud"}, "--log-level"},
		{"bad endpoint", []string{"--endpoints", "10.0.0.1:8000,nonsense"}, `pool.endpoints[1] "nonsense"`},
		{"missing config file", []string{"--config-file", filepath.Join(dir, "none.yaml")}, "none.yaml"},
		{"invalid config value", []string{"--config-file", badCfg}, "extProc.chunkBytes"},
		{"unknown plugin", []string{"--config-file", unknownPlugin}, `unknown plugin "magic-scorer"`},
		{"cert path without TLS", []string{"--secure-serving=false", "--cert-path", dir}, "--cert-path"},
		{"cert path without certs", []string{"--cert-path", dir, "--grpc-port", "0", "--grpc-health-port", "0", "--metrics-port", "0"}, "tls.crt"},
		{"stray argument", []string{"serve"}, "unexpected arguments"},
		{"negative scrape interval", []string{"--refresh-metrics-interval", "-1s"}, "--refresh-metrics-interval or --metrics-staleness-threshold: pool.metrics.refreshInterval -1s"},
		{"staleness under two scrape intervals", []string{"--metrics-staleness-threshold", "60ms"}, "pool.metrics.stalenessThreshold 60ms (--metrics-staleness-threshold): want at least twice"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := run(tc.args)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run(%q) = %v, want an error mentioning %q", tc.args, err, tc.want)
			}
		})
	}
}

func TestHelpExitsZero(t *testing.T) {
	for _, arg := range []string{"--help", "-h"} {
		if err := run([]string{arg}); err != nil {
			t.Errorf("run(%q) = %v, want nil (exit 0)", arg, err)
		}
	}
}

// TestMetricsAddressPrecedence: --metrics-bind-address wins; --metrics-port (or the chart's
// metricsPort) still works alone; neither means :9090 on every interface.
func TestMetricsAddressPrecedence(t *testing.T) {
	tests := []struct {
		name    string
		set     []string
		bind    string
		port    int
		want    string
		wantErr string
	}{
		{"default", nil, ":9090", 9090, ":9090", ""},
		{"port alone", []string{"metrics-port"}, ":9090", 9191, ":9191", ""},
		{"chart alias alone", []string{"metricsPort"}, ":9090", 9191, ":9191", ""},
		{"bind address alone", []string{"metrics-bind-address"}, "127.0.0.1:9090", 9090, "127.0.0.1:9090", ""},
		{"bind address wins over the port", []string{"metrics-bind-address", "metrics-port"}, "127.0.0.1:9292", 9191, "127.0.0.1:9292", ""},
		{"IPv6 loopback", []string{"metrics-bind-address"}, "[::1]:0", 9090, "[::1]:0", ""},
		{"no port", []string{"metrics-bind-address"}, "127.0.0.1", 9090, "", "want host:port"},
		{"port out of range", []string{"metrics-bind-address"}, ":70000", 9090, "", "not in 0..65535"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			set := map[string]bool{}
			for _, n := range tc.set {
				set[n] = true
			}
			got, err := metricsAddress(set, tc.bind, tc.port)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "--metrics-bind-address") {
					t.Fatalf("err = %v, want one naming --metrics-bind-address and %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("metricsAddress = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestPluginParameterErrorsNameTheirPath: a plugin parameter that is misspelt or mistyped is named
// as plugins[i].parameters.<field>, with the plugin's name.
func TestPluginParameterErrorsNameTheirPath(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, yaml string
		want       []string
	}{
		{"misspelt", "plugins:\n- name: saturation-filter\n  parameters:\n    maxInFlight: 5\n",
			[]string{"plugins[0].parameters.maxInFlight", "saturation-filter", "did you mean maxInFlightPerEndpoint?"}},
		{"mistyped", "plugins:\n- name: subset-filter\n- name: saturation-filter\n  parameters:\n    maxInFlightPerEndpoint: lots\n",
			[]string{"plugins[1].parameters.maxInFlightPerEndpoint", "saturation-filter"}},
		{"duration as a number", "plugins:\n- name: prefix-scorer\n  parameters:\n    pendingTTL: 30\n",
			[]string{"plugins[0].parameters.pendingTTL", "prefix-scorer", "duration"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
			if err := os.WriteFile(f, []byte(tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			err := run([]string{"--config-file", f})
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Fatalf("run = %v, want an error mentioning %q", err, w)
				}
			}
		})
	}
}
