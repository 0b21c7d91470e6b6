package config

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDefaultFileParses(t *testing.T) {
	c := Default()
	if c.ExtProc.MaxBodyBytes != 32<<20 || c.ExtProc.ChunkBytes != 62000 || c.ExtProc.AssumedBodyMode != "FULL_DUPLEX_STREAMED" {
		t.Fatalf("extProc defaults %+v", c.ExtProc)
	}
	if len(c.Plugins) == 0 {
		t.Fatal("no default plugins")
	}
	if got, err := Load(""); err != nil || len(got.Plugins) != len(c.Plugins) {
		t.Fatalf("Load(\"\") = %v, %v", got, err)
	}
}

func TestUserFileOverridesOnlyWhatItSets(t *testing.T) {
	c, err := Parse([]byte("extProc:\n  chunkBytes: 16384\npool:\n  endpoints: [\"10.0.0.1:8000\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.ExtProc.ChunkBytes != 16384 || c.ExtProc.MaxBodyBytes != 32<<20 {
		t.Fatalf("extProc %+v", c.ExtProc)
	}
	if len(c.Pool.Endpoints) != 1 || len(c.Plugins) != len(Default().Plugins) {
		t.Fatalf("pool %v, %d plugins", c.Pool.Endpoints, len(c.Plugins))
	}
	c2, err := Parse([]byte("plugins:\n- name: max-score-picker\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(c2.Plugins) != 1 || c2.Plugins[0].Name != "max-score-picker" || c2.Plugins[0].Parameters != nil {
		t.Fatalf("a plugins list must replace the default one: %+v", c2.Plugins)
	}
}

func TestBadConfigNamesTheField(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"unknown top-level field", "poool: {}\n", `unknown field "poool"`},
		{"unknown nested field", "extProc:\n  chunkSize: 5\n", `unknown field "chunkSize"`},
		{"wrong type", "extProc:\n  maxBodyBytes: lots\n", "extProc.maxBodyBytes"},
		{"body limit too small", "extProc:\n  maxBodyBytes: 0\n", "extProc.maxBodyBytes"},
		{"chunk too large", "extProc:\n  chunkBytes: 100000\n", "extProc.chunkBytes"},
		{"negative fallbacks", "extProc:\n  fallbacks: -1\n", "extProc.fallbacks"},
		{"unknown body mode", "extProc:\n  assumedBodyMode: SOMETIMES\n", "extProc.assumedBodyMode"},
		{"negative health interval", "pool:\n  healthCheck:\n    interval: -1s\n", "pool.healthCheck.interval"},
		{"health timeout over interval", "pool:\n  healthCheck:\n    timeout: 5s\n", "pool.healthCheck.timeout"},
		{"relative health path", "pool:\n  healthCheck:\n    path: health\n", "pool.healthCheck.path"},
		{"zero health threshold", "pool:\n  healthCheck:\n    unhealthyThreshold: 0\n", "thresholds"},
		{"bad duration", "pool:\n  healthCheck:\n    interval: soon\n", "invalid duration"},
		{"plugin without name", "plugins:\n- weight: 1\n", "plugins[0]: name is required"},
		{"plugin twice", "plugins:\n- name: a\n- name: a\n", `plugins[1]: "a" is listed twice`},
		{"not YAML", "extProc: [\n", "not valid YAML"},
		{"peer without a port", "peers:\n  addresses: [kvpick-peers]\n", "peers.addresses"},
		{"peers polled never", "peers:\n  addresses: ['a:1']\n  interval: 0s\n", "peers.interval"},
		{"peers wait longer than a poll may", "peers:\n  addresses: ['a:1']\n  wait: 2s\n", "peers.wait"},
		{"peers' log holds nothing", "peers:\n  addresses: ['a:1']\n  logBlocks: 0\n", "peers.logBlocks"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestLoadReportsTheFile(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Fatal("missing file accepted")
	}
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte("extProc:\n  fallbacks: 99\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), p) {
		t.Fatalf("err = %v, want it to name the file", err)
	}
	empty := filepath.Join(t.TempDir(), "empty.yaml")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if c, err := Load(empty); err != nil || len(c.Plugins) == 0 {
		t.Fatalf("an empty file must mean the defaults: %v", err)
	}
}

func TestSetParameterKeepsTheOtherParameters(t *testing.T) {
	tests := []struct {
		plugin    string
		wantFound bool
	}{
		{"prefix-scorer", true},
		{"no-such-plugin", false},
	}
	for _, tc := range tests {
		t.Run(tc.plugin, func(t *testing.T) {
			c := Default()
			found, err := c.SetParameter(tc.plugin, "lruCapacityPerEndpoint", 1234)
			if err != nil || found != tc.wantFound {
				t.Fatalf("found %v, err %v; want found %v", found, err, tc.wantFound)
			}
			var got map[string]any
			for _, p := range c.Plugins {
				if p.Name == "prefix-scorer" {
					if err := json.Unmarshal(p.Parameters, &got); err != nil {
						t.Fatal(err)
					}
				}
			}
			wantCap := float64(21000)
			if tc.wantFound {
				wantCap = 1234
			}
			if got["lruCapacityPerEndpoint"] != wantCap || got["blockSize"] != float64(64) {
				t.Errorf("prefix-scorer parameters %v: want capacity %v and the other defaults kept", got, wantCap)
			}
			if err := c.Validate(); err != nil {
				t.Errorf("the result does not validate: %v", err)
			}
		})
	}
}
