package plugins_test

import (
	"strings"
	"testing"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/plugins"
	"github.com/kvpick/kvpick/pkg/plugins/loadguard"
)

func TestBuildDefaultPlugins(t *testing.T) {
	b, err := plugins.Build(config.Default().Plugins, plugins.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range b.Plugins {
		names = append(names, p.Name())
	}
	want := "subset-filter,health-filter,saturation-filter,load-guard,prefix-scorer,prefill-scorer,cache-room-scorer,inflight-scorer,kv-fit-scorer,max-score-picker"
	if strings.Join(names, ",") != want {
		t.Fatalf("plugins %v", names)
	}
	if b.Weights["prefix-scorer"] != 1 || b.Weights["prefill-scorer"] != 4 || b.Weights["cache-room-scorer"] != 2 || b.Weights["inflight-scorer"] != 1 || b.Weights["kv-fit-scorer"] != 4 {
		t.Fatalf("weights %v", b.Weights)
	}
}

func TestBuildRejectsBadPluginConfig(t *testing.T) {
	w := 2.0
	neg := -1.0
	tests := []struct {
		name    string
		specs   []config.Plugin
		wantErr string
	}{
		{"unknown plugin", []config.Plugin{{Name: "best-guess"}}, `unknown plugin "best-guess"`},
		{"unknown parameter", []config.Plugin{{Name: "prefix-scorer", Parameters: []byte(`{"blockSzie":64}`)}}, `unknown field "blockSzie"`},
		{"wrong parameter type", []config.Plugin{{Name: "load-guard", Parameters: []byte(`{"absoluteMargin":"eight"}`)}}, "absoluteMargin"},
		{"invalid parameter value", []config.Plugin{{Name: "prefix-scorer", Parameters: []byte(`{"blockSize":1}`)}}, "blockSize"},
		{"weight on a filter", []config.Plugin{{Name: "load-guard", Weight: &w}}, "weight is only for scorers"},
		{"negative weight", []config.Plugin{{Name: "inflight-scorer", Weight: &neg}}, "must not be negative"},
		{"prefill scorer without the prefix scorer before it", []config.Plugin{{Name: "prefill-scorer"}, {Name: "prefix-scorer"}}, "needs prefix-scorer listed before it"},
		{"cache-room scorer without the prefix scorer", []config.Plugin{{Name: "cache-room-scorer"}}, "needs prefix-scorer listed before it"},
		{"kv-fit scorer without the prefix scorer", []config.Plugin{{Name: "kv-fit-scorer"}}, "needs prefix-scorer listed before it"},
		{"parameters on a plugin without any", []config.Plugin{{Name: "subset-filter", Parameters: []byte(`{"x":1}`)}}, "takes no parameters"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := plugins.Build(tc.specs, plugins.Deps{})
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.wantErr)
			}
		})
	}
}

func TestUserParametersOverrideDefaultsFieldByField(t *testing.T) {
	b, err := plugins.Build([]config.Plugin{{Name: "load-guard", Parameters: []byte(`{"absoluteMargin":1}`)}}, plugins.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	g := b.Plugins[0].(*loadguard.Filter)
	// absoluteMargin 1 from the user, relativeMargin 1.0 from default.yaml.
	if !g.Over(5, 2) || g.Over(4, 2) || g.Over(2, 1) {
		t.Fatal("merged parameters are not {absoluteMargin: 1, relativeMargin: 1.0}")
	}
}
