package config_test

import (
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/plugins"
)

// pipelineOf summarises a configuration's pipeline: plugin names in order, the weight of each
// scorer and the parameters given to each plugin (beyond config/default.yaml's).
func pipelineOf(t *testing.T, c *config.Config) (names []string, weights map[string]float64, params map[string]map[string]any) {
	t.Helper()
	weights, params = map[string]float64{}, map[string]map[string]any{}
	for _, p := range c.Plugins {
		names = append(names, p.Name)
		if p.Weight != nil {
			weights[p.Name] = *p.Weight
		}
		if len(p.Parameters) > 0 {
			var m map[string]any
			if err := json.Unmarshal(p.Parameters, &m); err != nil {
				t.Fatal(err)
			}
			params[p.Name] = m
		}
	}
	return names, weights, params
}

// The filters every translated pipeline starts with, and its picker.
var (
	translatedFilters = []string{"subset-filter", "health-filter", "saturation-filter", "load-guard"}
	translatedPicker  = "max-score-picker"
)

func TestEndpointPickerConfigTranslates(t *testing.T) {
	tests := []struct {
		name      string
		file      string
		scorers   []string // in pipeline order, between the filters and the picker
		weights   map[string]float64
		params    map[string]map[string]any
		fallbacks int
	}{
		{
			// The reference chart's default-plugins.yaml.
			name: "the reference chart's default file",
			file: `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
`,
			scorers: []string{"prefix-scorer", "cache-room-scorer", "inflight-scorer", "kv-fit-scorer"},
			weights: map[string]float64{"prefix-scorer": 3, "cache-room-scorer": 2, "inflight-scorer": 2, "kv-fit-scorer": 2},
			params:  map[string]map[string]any{},
		},
		{
			// The shape of the reference's documented full example, with the token block size of
			// current releases: 32-token blocks are 128 characters, so 256 of them cover 32 KiB
			// and an LRU of 31,250 of them holds 62,500 blocks of 16 tokens.
			name: "prefix parameters in tokens, named plugins, fallbacks",
			file: `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- name: prefix
  type: prefix-cache-scorer
  parameters:
    autoTune: false
    blockSizeTokens: 32
    maxPrefixBlocksToMatch: 256
    lruCapacityPerServer: 31250
- name: maxScore
  type: max-score-picker
  parameters:
    maxNumOfEndpoints: 3
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix
    weight: 50
  - pluginRef: maxScore
`,
			scorers:   []string{"prefix-scorer"},
			weights:   map[string]float64{"prefix-scorer": 50},
			params:    map[string]map[string]any{"prefix-scorer": {"blockSize": 128.0, "maxBlocksPerRequest": 256.0, "lruCapacityPerEndpoint": 62500.0, "capacityFromMetrics": false}},
			fallbacks: 2,
		},
		{
			// Older releases: the block in characters (hashBlockSize), 64 by default.
			name: "legacy character block size",
			file: `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  parameters:
    hashBlockSize: 128
    maxPrefixBlocksToMatch: 512
    lruCapacityPerServer: 1000
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
`,
			scorers: []string{"prefix-scorer"},
			weights: map[string]float64{"prefix-scorer": 1},
			// 128 characters = 32 tokens: 1,000 of them are 2,000 blocks of 16 tokens.
			params: map[string]map[string]any{"prefix-scorer": {"blockSize": 128.0, "maxBlocksPerRequest": 512.0, "lruCapacityPerEndpoint": 2000.0}},
		},
		{
			// A match bounded in tokens, with kvpick's own 64-byte block: 131,072 tokens x 4.
			name: "match bound in tokens",
			file: `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  parameters:
    maxPrefixTokensToMatch: 131072
    autoTune: true
`,
			scorers: []string{"prefix-scorer"},
			weights: map[string]float64{"prefix-scorer": 1},
			params:  map[string]map[string]any{"prefix-scorer": {"maxBlocksPerRequest": 8192.0, "capacityFromMetrics": true}},
		},
		{
			// Without schedulingProfiles every plugin is in one profile with weight 1.
			name: "no profile",
			file: `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: running-requests-size-scorer
- type: queue-scorer
- type: kv-cache-utilization-scorer
`,
			// cache-room and kv-fit read prefix-scorer's index: it comes along with weight 0.
			scorers: []string{"prefix-scorer", "cache-room-scorer", "inflight-scorer", "kv-fit-scorer"},
			weights: map[string]float64{"prefix-scorer": 0, "cache-room-scorer": 1, "inflight-scorer": 2, "kv-fit-scorer": 1},
			params:  map[string]map[string]any{},
		},
		{
			name: "low-queue filter",
			file: `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: low-queue
  parameters:
    threshold: 64
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: low-queue
  - pluginRef: queue-scorer
    weight: 1.5
`,
			scorers: []string{"inflight-scorer"},
			weights: map[string]float64{"inflight-scorer": 1.5},
			params:  map[string]map[string]any{"saturation-filter": {"maxWaitingRequests": 64.0}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := config.Parse([]byte(tc.file))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			names, weights, params := pipelineOf(t, c)
			want := slices.Concat(translatedFilters, tc.scorers, []string{translatedPicker})
			if !slices.Equal(names, want) {
				t.Errorf("pipeline %v, want %v", names, want)
			}
			if !maps.Equal(weights, tc.weights) {
				t.Errorf("weights %v, want %v", weights, tc.weights)
			}
			if !reflect.DeepEqual(params, tc.params) {
				t.Errorf("parameters %v, want %v", params, tc.params)
			}
			if c.ExtProc.Fallbacks != tc.fallbacks {
				t.Errorf("fallbacks %d, want %d", c.ExtProc.Fallbacks, tc.fallbacks)
			}
			// What is not in the file keeps kvpick's defaults.
			d := config.Default()
			if c.ExtProc.MaxBodyBytes != d.ExtProc.MaxBodyBytes || !reflect.DeepEqual(c.Pool, d.Pool) {
				t.Error("the translation changed settings outside the pipeline")
			}
			// The picker builds the translated pipeline.
			if _, err := plugins.Build(c.Plugins, plugins.Deps{}); err != nil {
				t.Errorf("plugins.Build: %v", err)
			}
		})
	}
}

func TestEndpointPickerConfigRefusals(t *testing.T) {
	const head = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
	tests := []struct {
		name string
		file string
		want []string // every one must appear in the error
	}{
		{"a plugin type without equivalent", head + "plugins:\n- type: prefix-cache-scorer\n- type: random-picker\n",
			[]string{"line 5", "plugins[1] (random-picker)", `type "random-picker" has no kvpick equivalent`}},
		{"an unused plugin type without equivalent", head + "plugins:\n- type: prefix-cache-scorer\n- type: lora-affinity-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: prefix-cache-scorer\n",
			[]string{"line 5", "lora-affinity-scorer"}},
		{"a parameter without equivalent", head + "plugins:\n- type: prefix-cache-scorer\n  parameters:\n    blockSizeTokens: 16\n    hashSeed: abc\n",
			[]string{"line 7", "plugins[0] (prefix-cache-scorer).parameters.hashSeed", "no kvpick equivalent", "blockSizeTokens"}},
		{"parameters on a scorer that takes none", head + "plugins:\n- type: queue-scorer\n  parameters:\n    threshold: 3\n",
			[]string{"line 6", "plugins[0] (queue-scorer).parameters.threshold", "takes no parameters"}},
		{"a parameter of the wrong type", head + "plugins:\n- type: prefix-cache-scorer\n  parameters:\n    lruCapacityPerServer: lots\n",
			[]string{"line 6", "lruCapacityPerServer", "positive integer"}},
		{"prefill/decode profiles", head + "plugins:\n- type: prefix-cache-scorer\nschedulingProfiles:\n- name: prefill\n  plugins:\n  - pluginRef: prefix-cache-scorer\n- name: decode\n  plugins:\n  - pluginRef: prefix-cache-scorer\n",
			[]string{"line 9", "[prefill decode]", "single profile"}},
		{"a reference to nothing", head + "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue\n",
			[]string{"line 8", `pluginRef "queue" names no plugin`}},
		{"a negative weight", head + "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n    weight: -1\n",
			[]string{"line 9", "weight", "at least 0"}},
		{"a section without equivalent", head + "plugins:\n- type: queue-scorer\nsaturationDetector:\n  pluginRef: x\n",
			[]string{"line 5", `"saturationDetector" section has no kvpick equivalent`}},
		{"another API version", "apiVersion: inference.networking.x-k8s.io/v1beta1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n",
			[]string{"line 1", "v1alpha1"}},
		{"two plugins with one name", head + "plugins:\n- type: queue-scorer\n- type: prefix-cache-scorer\n  name: queue-scorer\n",
			[]string{"line 5", `name "queue-scorer" is also plugins[0]'s`}},
		{"no plugins", head + "plugins: []\n", []string{"plugins: none listed"}},
		{"an unknown field of an entry", head + "plugins:\n- type: queue-scorer\n  weight: 2\n", []string{"line 5", "plugins[0].weight: unknown field"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.file))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestEndpointPickerConfigOutOfRange: a value that translates outside kvpick's range is refused
// when the picker builds its plugins, naming kvpick's parameter (the reference's documented
// example uses 5-character blocks; kvpick's blocks are 16 bytes at least).
func TestEndpointPickerConfigOutOfRange(t *testing.T) {
	c, err := config.Parse([]byte(`apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  parameters:
    hashBlockSize: 5
    maxPrefixBlocksToMatch: 256
    lruCapacityPerServer: 31250
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
    weight: 50
`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	_, err = plugins.Build(c.Plugins, plugins.Deps{})
	if err == nil || !strings.Contains(err.Error(), "prefix-scorer") || !strings.Contains(err.Error(), "blockSize 5") {
		t.Errorf("Build: %v, want prefix-scorer's blockSize refused", err)
	}
}

// TestKvpickFormatIsNotMistakenForEndpointPickerConfig: detection is by kind only.
func TestKvpickFormatIsNotMistakenForEndpointPickerConfig(t *testing.T) {
	for _, text := range []string{"", "extProc:\n  fallbacks: 1\n", "plugins:\n- name: prefix-scorer\n"} {
		if _, err := config.Parse([]byte(text)); err != nil {
			t.Errorf("%q: %v", text, err)
		}
	}
	if _, err := config.Parse([]byte("kind: Other\nplugins: []\n")); err == nil || !strings.Contains(err.Error(), `unknown field "kind"`) {
		t.Errorf("another kind: %v, want kvpick's unknown-field error", err)
	}
}
