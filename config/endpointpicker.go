package config

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// The reference endpoint picker's configuration file (Gateway API Inference Extension, the
// `inferencepool` chart's `pluginsCustomConfig`): kind EndpointPickerConfig, plugins by type with
// optional names and parameters, and scheduling profiles that reference them with weights.
// Loading it gives kvpick's own pipeline: every plugin and parameter that has a kvpick
// equivalent is translated, units included; anything else is refused with its line and path,
// so that a user migrating keeps the file and learns exactly what does not carry over. The
// table in docs/deploy.md ("Migrating an EndpointPickerConfig") documents the mapping.

const (
	eppAPIVersion = "inference.networking.x-k8s.io/v1alpha1"
	eppKind       = "EndpointPickerConfig"
	// The reference picker hashes prompt characters and converts its token block sizes to
	// characters at 4 per token (its averageCharactersPerToken); kvpick hashes bytes of the
	// rendered prompt. Characters count as bytes: prompts are mostly ASCII.
	eppCharsPerToken = 4
	// kvpick's lruCapacityPerEndpoint counts KV blocks of this many tokens (config/default.yaml).
	kvBlockTokens = 16
	// The reference picker's default block: 16 tokens (vLLM's block size).
	eppDefaultBlockTokens = 16
)

// isEndpointPickerConfig reports whether a configuration file is in the reference picker's
// format, by its top-level kind.
func isEndpointPickerConfig(b []byte) bool {
	var head struct {
		Kind string `yaml:"kind"`
	}
	return yaml.Unmarshal(b, &head) == nil && head.Kind == eppKind
}

// eppPlugin is one entry of the file's plugins list.
type eppPlugin struct {
	index  int
	line   int
	typ    string
	name   string
	params *yaml.Node // a mapping, or nil
	used   bool       // referenced by the profile
}

func (p *eppPlugin) path() string {
	return fmt.Sprintf("plugins[%d] (%s)", p.index, p.typ)
}

// eppError is an error at a line of the file.
func eppError(n *yaml.Node, format string, a ...any) error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return fmt.Errorf("EndpointPickerConfig line %d: %s", line, fmt.Sprintf(format, a...))
}

// translation accumulates kvpick's pipeline.
type translation struct {
	params    map[string]map[string]any // by kvpick plugin name
	weights   map[string]float64        // scorers
	fallbacks int
}

func (t *translation) set(plugin, key string, v any) {
	if t.params[plugin] == nil {
		t.params[plugin] = map[string]any{}
	}
	t.params[plugin][key] = v
}

func (t *translation) addWeight(scorer string, w float64) { t.weights[scorer] += w }

// eppTranslator translates one referenced plugin of a type; weight is the profile's.
type eppTranslator func(p *eppPlugin, weight float64, t *translation) error

// eppTypes lists the reference plugin types kvpick understands. Types not listed are refused.
// (Filled in init: its translators reach Default, whose parsing reaches this table.)
var eppTypes map[string]eppTranslator

func init() {
	eppTypes = map[string]eppTranslator{
		"prefix-cache-scorer": translatePrefix,
		// queue-scorer prefers short waiting queues; kvpick's inflight-scorer prefers low load, the
		// larger of the requests it has in flight on a server and the server's scraped running +
		// waiting count.
		"queue-scorer":                 scorersOnly("inflight-scorer"),
		"running-requests-size-scorer": scorersOnly("inflight-scorer"),
		// kv-cache-utilization-scorer prefers servers whose KV cache is least used; kvpick reads
		// the same metric in kv-fit-scorer (does what the prompt adds fit in the free part?) and
		// adds cache-room-scorer (servers where the prompt evicts nothing or only stale blocks),
		// each with the profile's weight (docs/deploy.md: kv-fit beside cache-room took the
		// translated reference default's agent p90 on small caches 175 -> 160 ms, seeds 1-6).
		"kv-cache-utilization-scorer": scorersOnly("cache-room-scorer", "kv-fit-scorer"),
		"max-score-picker":            translatePicker,
		// kvpick runs one profile: the handler that always picks the one profile changes nothing.
		"single-profile-handler": noParams(nil),
		// Older releases' filters on the scraped waiting queue: a server with more waiting requests
		// than the threshold is left out (kvpick: and 429 when every server is).
		"low-queue":        translateLowQueue,
		"low-queue-filter": translateLowQueue,
	}
}

// ParseEndpointPickerConfig reads the reference picker's configuration file on top of the
// defaults and returns the kvpick configuration it translates to.
func ParseEndpointPickerConfig(b []byte) (*Config, error) {
	return parseEndpointPickerConfig(b, Default())
}

func parseEndpointPickerConfig(b []byte, base *Config) (*Config, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("EndpointPickerConfig: not valid YAML: %w", err)
	}
	if len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, eppError(&doc, "want a mapping with apiVersion, kind, plugins and schedulingProfiles")
	}
	var (
		plugins  []*eppPlugin
		byName   = map[string]*eppPlugin{}
		profiles *yaml.Node
	)
	top := doc.Content[0]
	for i := 0; i < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		switch k.Value {
		case "apiVersion":
			if v.Value != eppAPIVersion {
				return nil, eppError(v, "apiVersion %q: want %s", v.Value, eppAPIVersion)
			}
		case "kind":
		case "plugins":
			if v.Kind != yaml.SequenceNode {
				return nil, eppError(v, "plugins: want a list")
			}
			for j, n := range v.Content {
				p, err := readEPPPlugin(j, n)
				if err != nil {
					return nil, err
				}
				if prev := byName[p.name]; prev != nil {
					return nil, eppError(n, "%s: name %q is also plugins[%d]'s", p.path(), p.name, prev.index)
				}
				byName[p.name] = p
				plugins = append(plugins, p)
			}
		case "schedulingProfiles":
			if v.Kind != yaml.SequenceNode {
				return nil, eppError(v, "schedulingProfiles: want a list")
			}
			profiles = v
		case "featureGates":
			if len(v.Content) > 0 {
				return nil, eppError(v, "featureGates: the reference picker's experimental features have no kvpick equivalent; remove them")
			}
		default:
			return nil, eppError(k, "%s: the reference picker's %q section has no kvpick equivalent; remove it", k.Value, k.Value)
		}
	}
	if len(plugins) == 0 {
		return nil, eppError(top, "plugins: none listed")
	}
	for _, p := range plugins {
		if _, ok := eppTypes[p.typ]; !ok {
			return nil, eppError(p.typeNode(), "%s: type %q has no kvpick equivalent (kvpick understands: %s); remove it or replace it with one of those",
				p.path(), p.typ, strings.Join(slicesSorted(eppTypes), ", "))
		}
	}

	// The profile: its plugins and weights. No profile means one referencing every plugin.
	var refs []eppRef
	switch {
	case profiles == nil || len(profiles.Content) == 0:
		for _, p := range plugins {
			refs = append(refs, eppRef{p, 1})
		}
	case len(profiles.Content) > 1:
		var names []string
		for _, n := range profiles.Content {
			names = append(names, scalar(n, "name"))
		}
		return nil, eppError(profiles.Content[1], "schedulingProfiles: %d profiles %v; kvpick runs a single profile (no prefill/decode disaggregation or SLO profiles): keep one", len(names), names)
	default:
		prof := profiles.Content[0]
		if prof.Kind != yaml.MappingNode {
			return nil, eppError(prof, "schedulingProfiles[0]: want a mapping with name and plugins")
		}
		for i := 0; i < len(prof.Content); i += 2 {
			k, v := prof.Content[i], prof.Content[i+1]
			switch k.Value {
			case "name":
			case "plugins":
				if v.Kind != yaml.SequenceNode {
					return nil, eppError(v, "schedulingProfiles[0].plugins: want a list")
				}
				for j, n := range v.Content {
					r, err := readEPPRef(j, n, byName)
					if err != nil {
						return nil, err
					}
					refs = append(refs, r)
				}
			default:
				return nil, eppError(k, "schedulingProfiles[0].%s: unknown field", k.Value)
			}
		}
	}

	t := &translation{params: map[string]map[string]any{}, weights: map[string]float64{}}
	for _, r := range refs {
		if r.p.used {
			return nil, eppError(r.p.typeNode(), "%s is referenced twice in the profile", r.p.path())
		}
		r.p.used = true
		if err := eppTypes[r.p.typ](r.p, r.weight, t); err != nil {
			return nil, err
		}
	}
	// Unreferenced plugins do nothing in the reference picker either, but their parameters must
	// still make sense: check them as if referenced, into a throwaway translation.
	for _, p := range plugins {
		if !p.used {
			scratch := &translation{params: map[string]map[string]any{}, weights: map[string]float64{}}
			if err := eppTypes[p.typ](p, 0, scratch); err != nil {
				return nil, err
			}
		}
	}

	c := &Config{}
	*c = *base
	pipeline, err := t.pipeline()
	if err != nil {
		return nil, err
	}
	c.Plugins = pipeline
	if t.fallbacks > 0 {
		c.ExtProc.Fallbacks = t.fallbacks
	}
	return c, c.Validate()
}

// pipeline assembles kvpick's plugin list: its filters (which stand for what the reference
// picker does outside its plugin list: the subset hint, ready endpoints only, saturation; plus
// load-guard, kvpick's backstop against hot spots), the translated scorers in the order their
// dependencies need, and the picker.
func (t *translation) pipeline() ([]Plugin, error) {
	for _, needsIndex := range []string{"cache-room-scorer", "kv-fit-scorer"} {
		if _, ok := t.weights[needsIndex]; !ok {
			continue
		}
		if _, ok := t.weights["prefix-scorer"]; !ok {
			// cache-room-scorer and kv-fit-scorer read prefix-scorer's index; weight 0 keeps the
			// index without adding prefix affinity the file did not ask for.
			t.weights["prefix-scorer"] = 0
		}
	}
	var out []Plugin
	for _, name := range []string{"subset-filter", "health-filter", "saturation-filter", "load-guard",
		"prefix-scorer", "cache-room-scorer", "inflight-scorer", "kv-fit-scorer", "max-score-picker"} {
		p := Plugin{Name: name}
		w, scorer := t.weights[name]
		if strings.HasSuffix(name, "-scorer") {
			if !scorer {
				continue
			}
			p.Weight = &w
		}
		if params := t.params[name]; len(params) > 0 {
			b, err := json.Marshal(params)
			if err != nil {
				return nil, err
			}
			p.Parameters = b
		}
		out = append(out, p)
	}
	return out, nil
}

func (p *eppPlugin) typeNode() *yaml.Node {
	return &yaml.Node{Line: p.line}
}

func readEPPPlugin(i int, n *yaml.Node) (*eppPlugin, error) {
	if n.Kind != yaml.MappingNode {
		return nil, eppError(n, "plugins[%d]: want a mapping with type, name and parameters", i)
	}
	p := &eppPlugin{index: i, line: n.Line}
	for j := 0; j < len(n.Content); j += 2 {
		k, v := n.Content[j], n.Content[j+1]
		switch k.Value {
		case "type":
			p.typ, p.line = v.Value, v.Line
		case "name":
			p.name = v.Value
		case "parameters":
			if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
				continue
			}
			if v.Kind != yaml.MappingNode {
				return nil, eppError(v, "plugins[%d].parameters: want a mapping", i)
			}
			p.params = v
		default:
			return nil, eppError(k, "plugins[%d].%s: unknown field (want type, name, parameters)", i, k.Value)
		}
	}
	if p.typ == "" {
		return nil, eppError(n, "plugins[%d]: type is required", i)
	}
	if p.name == "" {
		p.name = p.typ
	}
	return p, nil
}

// eppRef is a profile's reference to a plugin, with its weight (1 when not given).
type eppRef struct {
	p      *eppPlugin
	weight float64
}

func readEPPRef(i int, n *yaml.Node, byName map[string]*eppPlugin) (eppRef, error) {
	r := eppRef{weight: 1}
	if n.Kind != yaml.MappingNode {
		return r, eppError(n, "schedulingProfiles[0].plugins[%d]: want a mapping with pluginRef and weight", i)
	}
	for j := 0; j < len(n.Content); j += 2 {
		k, v := n.Content[j], n.Content[j+1]
		switch k.Value {
		case "pluginRef":
			r.p = byName[v.Value]
			if r.p == nil {
				return r, eppError(v, "schedulingProfiles[0].plugins[%d].pluginRef %q names no plugin", i, v.Value)
			}
		case "weight":
			if err := v.Decode(&r.weight); err != nil || r.weight < 0 || math.IsNaN(r.weight) || math.IsInf(r.weight, 0) {
				return r, eppError(v, "schedulingProfiles[0].plugins[%d].weight %q: want a number of at least 0", i, v.Value)
			}
		default:
			return r, eppError(k, "schedulingProfiles[0].plugins[%d].%s: unknown field (want pluginRef, weight)", i, k.Value)
		}
	}
	if r.p == nil {
		return r, eppError(n, "schedulingProfiles[0].plugins[%d]: pluginRef is required", i)
	}
	return r, nil
}

// eppParams walks a plugin's parameters, handing each known key's node to its handler and
// refusing the others.
func eppParams(p *eppPlugin, handlers map[string]func(v *yaml.Node) error) error {
	if p.params == nil {
		return nil
	}
	for i := 0; i < len(p.params.Content); i += 2 {
		k, v := p.params.Content[i], p.params.Content[i+1]
		h, ok := handlers[k.Value]
		if !ok {
			known := slicesSorted(handlers)
			if len(known) == 0 {
				return eppError(k, "%s.parameters.%s: this plugin takes no parameters in kvpick", p.path(), k.Value)
			}
			return eppError(k, "%s.parameters.%s: no kvpick equivalent (understood: %s)", p.path(), k.Value, strings.Join(known, ", "))
		}
		if err := h(v); err != nil {
			return err
		}
	}
	return nil
}

// eppInt decodes a positive integer parameter.
func eppInt(p *eppPlugin, key string, v *yaml.Node, dst *int) error {
	if err := v.Decode(dst); err != nil || *dst < 1 {
		return eppError(v, "%s.parameters.%s %q: want a positive integer", p.path(), key, v.Value)
	}
	return nil
}

// scorersOnly translates a parameterless scorer into kvpick scorers, each with its weight.
func scorersOnly(kvpick ...string) eppTranslator {
	return noParams(func(_ *eppPlugin, w float64, t *translation) error {
		for _, k := range kvpick {
			t.addWeight(k, w)
		}
		return nil
	})
}

func noParams(f eppTranslator) eppTranslator {
	return func(p *eppPlugin, w float64, t *translation) error {
		if err := eppParams(p, nil); err != nil {
			return err
		}
		if f == nil {
			return nil
		}
		return f(p, w, t)
	}
}

// translatePrefix maps prefix-cache-scorer onto prefix-scorer, converting its block units.
func translatePrefix(p *eppPlugin, w float64, t *translation) error {
	var (
		blockTokens, blockChars, maxBlocks, maxTokens, lru int
		autoTune                                           *bool
	)
	err := eppParams(p, map[string]func(v *yaml.Node) error{
		"blockSizeTokens": func(v *yaml.Node) error { return eppInt(p, "blockSizeTokens", v, &blockTokens) },
		// blockSize (and, in older releases, hashBlockSize) is in characters of the prompt.
		"blockSize":              func(v *yaml.Node) error { return eppInt(p, "blockSize", v, &blockChars) },
		"hashBlockSize":          func(v *yaml.Node) error { return eppInt(p, "hashBlockSize", v, &blockChars) },
		"maxPrefixBlocksToMatch": func(v *yaml.Node) error { return eppInt(p, "maxPrefixBlocksToMatch", v, &maxBlocks) },
		"maxPrefixTokensToMatch": func(v *yaml.Node) error { return eppInt(p, "maxPrefixTokensToMatch", v, &maxTokens) },
		"lruCapacityPerServer":   func(v *yaml.Node) error { return eppInt(p, "lruCapacityPerServer", v, &lru) },
		"autoTune": func(v *yaml.Node) error {
			var b bool
			if err := v.Decode(&b); err != nil {
				return eppError(v, "%s.parameters.autoTune %q: want true or false", p.path(), v.Value)
			}
			autoTune = &b
			return nil
		},
	})
	if err != nil {
		return err
	}
	// The reference's block, in tokens and in characters. blockSizeTokens wins over the legacy
	// character size, as in the reference picker.
	theirTokens, theirChars := float64(eppDefaultBlockTokens), eppDefaultBlockTokens*eppCharsPerToken
	switch {
	case blockTokens > 0:
		theirTokens, theirChars = float64(blockTokens), blockTokens*eppCharsPerToken
	case blockChars > 0:
		theirTokens, theirChars = float64(blockChars)/eppCharsPerToken, blockChars
	}
	// kvpick's range for blockSize is checked where the plugin is built (pkg/prefix), which
	// names prefix-scorer's blockSize: docs/deploy.md gives the conversion.
	ours := defaultPrefixInt("blockSize")
	if blockTokens > 0 || blockChars > 0 {
		ours = theirChars
		t.set("prefix-scorer", "blockSize", ours)
	}
	// How much of a prompt is matched, in bytes, then in kvpick blocks.
	switch {
	case maxTokens > 0:
		t.set("prefix-scorer", "maxBlocksPerRequest", ceilDiv(maxTokens*eppCharsPerToken, ours))
	case maxBlocks > 0:
		t.set("prefix-scorer", "maxBlocksPerRequest", ceilDiv(maxBlocks*theirChars, ours))
	}
	if lru > 0 {
		t.set("prefix-scorer", "lruCapacityPerEndpoint", int(math.Ceil(float64(lru)*theirTokens/kvBlockTokens)))
	}
	if autoTune != nil {
		// autoTune sizes each server's index from the KV cache it reports; so does
		// capacityFromMetrics.
		t.set("prefix-scorer", "capacityFromMetrics", *autoTune)
	}
	t.addWeight("prefix-scorer", w)
	return nil
}

// translatePicker maps max-score-picker; maxNumOfEndpoints > 1 asks for fallbacks.
func translatePicker(p *eppPlugin, _ float64, t *translation) error {
	return eppParams(p, map[string]func(v *yaml.Node) error{
		"maxNumOfEndpoints": func(v *yaml.Node) error {
			var n int
			if err := eppInt(p, "maxNumOfEndpoints", v, &n); err != nil {
				return err
			}
			// The picked endpoint plus n-1 retry fallbacks, as an ordered list in
			// x-gateway-destination-endpoint.
			t.fallbacks = n - 1
			return nil
		},
	})
}

func translateLowQueue(p *eppPlugin, _ float64, t *translation) error {
	return eppParams(p, map[string]func(v *yaml.Node) error{
		"threshold": func(v *yaml.Node) error {
			var n int
			if err := eppInt(p, "threshold", v, &n); err != nil {
				return err
			}
			t.set("saturation-filter", "maxWaitingRequests", n)
			return nil
		},
	})
}

// defaultPrefixInt is config/default.yaml's value of a prefix-scorer parameter.
func defaultPrefixInt(key string) int {
	var m map[string]any
	if err := json.Unmarshal(DefaultParameters("prefix-scorer"), &m); err != nil {
		panic("config/default.yaml: prefix-scorer parameters: " + err.Error())
	}
	v, ok := m[key].(float64)
	if !ok {
		panic("config/default.yaml: prefix-scorer has no " + key)
	}
	return int(v)
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

func scalar(n *yaml.Node, key string) string {
	for i := 0; n.Kind == yaml.MappingNode && i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1].Value
		}
	}
	return ""
}

func slicesSorted[V any](m map[string]V) []string {
	var k []string
	for name := range m {
		k = append(k, name)
	}
	slices.Sort(k)
	return k
}
