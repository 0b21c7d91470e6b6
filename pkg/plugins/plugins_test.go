package plugins_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/internal/routertest"
	"github.com/kvpick/kvpick/pkg/plugins"
	"github.com/kvpick/kvpick/pkg/plugins/kvfit"
	"github.com/kvpick/kvpick/pkg/plugins/loadguard"
	"github.com/kvpick/kvpick/pkg/prefix"
	"github.com/kvpick/kvpick/pkg/router"
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

// TestPrefixKeepsRunningRecordsOnlyForKVFit: the prefix plugin keeps running records (pick to
// stream end) only when kv-fit-scorer, which reads them, is in the pipeline.
func TestPrefixKeepsRunningRecordsOnlyForKVFit(t *testing.T) {
	for _, withKVFit := range []bool{true, false} {
		t.Run(fmt.Sprintf("kv-fit=%v", withKVFit), func(t *testing.T) {
			var specs []config.Plugin
			for _, s := range config.Default().Plugins {
				if s.Name != kvfit.Name || withKVFit {
					specs = append(specs, s)
				}
			}
			b, err := plugins.Build(specs, plugins.Deps{})
			if err != nil {
				t.Fatal(err)
			}
			var px *prefix.Plugin
			for _, p := range b.Plugins {
				if q, ok := p.(*prefix.Plugin); ok {
					px = q
				}
			}
			ep := routertest.Endpoints(0)[0]
			req := routertest.Chat(t, strings.Repeat("a long enough prompt. ", 40))
			px.Prepare(context.Background(), req)
			px.Score(context.Background(), req, []*router.Endpoint{ep}, make([]float64, 1))
			px.Picked(req, ep)
			if got := px.RunningCount(); got != map[bool]int{true: 1, false: 0}[withKVFit] {
				t.Fatalf("%d running records after one pick", got)
			}
			px.Done(req, ep)
			if got := px.RunningCount(); got != 0 {
				t.Fatalf("%d running records after the stream ended", got)
			}
		})
	}
}
