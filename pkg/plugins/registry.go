// Package plugins turns the config file's plugin list into plugin instances: it knows every
// plugin by name, decodes its parameters strictly on top of config/default.yaml's, and checks
// that weights are given to scorers only.
package plugins

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/plugins/cacheroom"
	"github.com/kvpick/kvpick/pkg/plugins/health"
	"github.com/kvpick/kvpick/pkg/plugins/inflight"
	"github.com/kvpick/kvpick/pkg/plugins/kvfit"
	"github.com/kvpick/kvpick/pkg/plugins/loadguard"
	"github.com/kvpick/kvpick/pkg/plugins/maxscore"
	"github.com/kvpick/kvpick/pkg/plugins/prefill"
	"github.com/kvpick/kvpick/pkg/plugins/saturation"
	"github.com/kvpick/kvpick/pkg/plugins/subset"
	"github.com/kvpick/kvpick/pkg/prefix"
	"github.com/kvpick/kvpick/pkg/router"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Deps are what plugins may need from the process.
type Deps struct {
	Registerer prometheus.Registerer // nil: no metrics
	Logger     *zap.Logger           // nil: the plugins log nothing
}

type factory func(params json.RawMessage, d Deps) (router.Plugin, error)

var factories = map[string]factory{
	subset.Name:    noParams(func() router.Plugin { return &subset.Filter{} }),
	health.Name:    noParams(func() router.Plugin { return &health.Filter{} }),
	inflight.Name:  noParams(func() router.Plugin { return &inflight.Scorer{} }),
	maxscore.Name:  noParams(func() router.Plugin { return &maxscore.Picker{} }),
	cacheroom.Name: noParams(func() router.Plugin { return &cacheroom.Scorer{} }),
	kvfit.Name:     noParams(func() router.Plugin { return &kvfit.Scorer{} }),
	saturation.Name: func(raw json.RawMessage, _ Deps) (router.Plugin, error) {
		var p saturation.Params
		if err := decode(saturation.Name, raw, &p); err != nil {
			return nil, err
		}
		return saturation.New(p)
	},
	loadguard.Name: func(raw json.RawMessage, _ Deps) (router.Plugin, error) {
		var p loadguard.Params
		if err := decode(loadguard.Name, raw, &p); err != nil {
			return nil, err
		}
		return loadguard.New(p)
	},
	prefill.Name: func(raw json.RawMessage, _ Deps) (router.Plugin, error) {
		var p prefill.Params
		if err := decode(prefill.Name, raw, &p); err != nil {
			return nil, err
		}
		return prefill.New(p)
	},
	prefix.Name: func(raw json.RawMessage, d Deps) (router.Plugin, error) {
		var p prefix.Params
		if err := decode(prefix.Name, raw, &p); err != nil {
			return nil, err
		}
		return prefix.New(p, d.Registerer, prefix.WithLogger(d.Logger))
	},
}

// Names lists the known plugins.
func Names() []string {
	var n []string
	for k := range factories {
		n = append(n, k)
	}
	slices.Sort(n)
	return n
}

func noParams(f func() router.Plugin) factory {
	return func(raw json.RawMessage, _ Deps) (router.Plugin, error) {
		if len(bytes.TrimSpace(raw)) > 0 && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			return nil, fmt.Errorf("takes no parameters")
		}
		return f(), nil
	}
}

// decode fills dst with default.yaml's parameters for the plugin, then with raw, strictly.
func decode(name string, raw json.RawMessage, dst any) error {
	for _, layer := range []json.RawMessage{config.DefaultParameters(name), raw} {
		if len(bytes.TrimSpace(layer)) == 0 || bytes.Equal(bytes.TrimSpace(layer), []byte("null")) {
			continue
		}
		if err := config.CheckFields(layer, dst, "parameters"); err != nil {
			return err // names the field's path
		}
		dec := json.NewDecoder(bytes.NewReader(layer))
		dec.DisallowUnknownFields()
		if err := dec.Decode(dst); err != nil {
			if te, ok := err.(*json.UnmarshalTypeError); ok {
				return &config.FieldError{Path: "parameters." + te.Field, Err: fmt.Errorf("want %s, got %s", te.Type, te.Value)}
			}
			return fmt.Errorf("parameters: %s", strings.TrimPrefix(err.Error(), "json: "))
		}
	}
	return nil
}

// Built is the result of Build.
type Built struct {
	Plugins []router.Plugin    // in config order
	Weights map[string]float64 // scorer weights by name
}

// Build instantiates the configured plugins.
func Build(specs []config.Plugin, d Deps) (*Built, error) {
	b := &Built{Weights: map[string]float64{}}
	for i, s := range specs {
		f, ok := factories[s.Name]
		if !ok {
			return nil, fmt.Errorf("plugins[%d]: unknown plugin %q (known: %s)", i, s.Name, strings.Join(Names(), ", "))
		}
		p, err := f(s.Parameters, d)
		if err != nil {
			// A parameter's error is named by its path in the file: plugins[i].parameters.x.
			if fe := (*config.FieldError)(nil); errors.As(err, &fe) {
				return nil, fmt.Errorf("plugins[%d].%s (%s): %w", i, fe.Path, s.Name, fe.Err)
			}
			return nil, fmt.Errorf("plugins[%d] (%s): %w", i, s.Name, err)
		}
		_, isScorer := p.(router.Scorer)
		if s.Weight == nil && isScorer {
			s.Weight = defaultWeight(s.Name)
		}
		if s.Weight != nil {
			if !isScorer {
				return nil, fmt.Errorf("plugins[%d] (%s): weight is only for scorers", i, s.Name)
			}
			if *s.Weight < 0 {
				return nil, fmt.Errorf("plugins[%d] (%s): weight %v must not be negative", i, s.Name, *s.Weight)
			}
			b.Weights[s.Name] = *s.Weight
		}
		if s.Name == prefill.Name || s.Name == cacheroom.Name || s.Name == kvfit.Name {
			at := slices.IndexFunc(b.Plugins, func(q router.Plugin) bool { return q.Name() == prefix.Name })
			if at < 0 {
				return nil, fmt.Errorf("plugins[%d] (%s): needs %s listed before it", i, s.Name, prefix.Name)
			}
			if s.Name == kvfit.Name {
				// kv-fit reads the running records, which the prefix plugin keeps only on request.
				b.Plugins[at].(*prefix.Plugin).KeepRunningRecords()
			}
		}
		b.Plugins = append(b.Plugins, p)
	}
	return b, nil
}

// defaultWeight is default.yaml's weight for the named scorer, or 1.
func defaultWeight(name string) *float64 {
	for _, p := range config.Default().Plugins {
		if p.Name == name && p.Weight != nil {
			return p.Weight
		}
	}
	one := 1.0
	return &one
}
