// Package config loads the picker's configuration file. The defaults are config/default.yaml,
// compiled in: one place for every default, with the arithmetic behind it.
package config

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

//go:embed default.yaml
var defaultYAML []byte

// DefaultYAML returns the compiled-in default configuration file.
func DefaultYAML() []byte { return bytes.Clone(defaultYAML) }

// Config is the whole configuration.
type Config struct {
	Pool    Pool     `json:"pool"`
	ExtProc ExtProc  `json:"extProc"`
	Plugins []Plugin `json:"plugins"`
	// Shutdown and Kubernetes are the process's settings (config/process.go).
	Shutdown   Shutdown   `json:"shutdown"`
	Kubernetes Kubernetes `json:"kubernetes"`
	// Peers is left out of a written configuration while it lists no addresses (Peers.IsZero),
	// so that pickers built before it existed (which refuse unknown fields) read what a newer
	// tool writes; a reader fills it from its own defaults.
	Peers Peers `json:"peers,omitzero"`
}

// Pool is the static endpoint pool.
type Pool struct {
	Endpoints   []string    `json:"endpoints"`
	HealthCheck HealthCheck `json:"healthCheck"`
	// Metrics configures the scrape of the model servers' metrics (pool.metrics).
	Metrics ModelServerMetrics `json:"metrics"`
}

// HealthCheck configures the active health check of the pool's endpoints.
type HealthCheck struct {
	Path               string   `json:"path"`
	Interval           Duration `json:"interval"`
	Timeout            Duration `json:"timeout"`
	UnhealthyThreshold int      `json:"unhealthyThreshold"`
	HealthyThreshold   int      `json:"healthyThreshold"`
}

// ExtProc configures the ext_proc server.
type ExtProc struct {
	MaxBodyBytes int64 `json:"maxBodyBytes"`
	ChunkBytes   int   `json:"chunkBytes"`
	Fallbacks    int   `json:"fallbacks"`
	// AssumedBodyMode is the body mode assumed when the proxy sends no protocol_config.
	AssumedBodyMode string `json:"assumedBodyMode"`
	// ExplainHeader answers a request's x-kvpick-explain: 1 with the decision's scores.
	ExplainHeader bool `json:"explainHeader"`
}

// BodyModes are the values AssumedBodyMode accepts.
var BodyModes = []string{"FULL_DUPLEX_STREAMED", "BUFFERED", "BUFFERED_PARTIAL", "STREAMED", "NONE"}

// Plugin is one entry of the pipeline.
type Plugin struct {
	Name       string          `json:"name"`
	Weight     *float64        `json:"weight,omitempty"`
	Parameters json.RawMessage `json:"parameters,omitempty"`
}

// SetParameter sets one parameter of every listed plugin of that name, keeping its other
// parameters; it reports whether the pipeline lists the plugin at all.
func (c *Config) SetParameter(plugin, key string, value any) (found bool, err error) {
	for i, p := range c.Plugins {
		if p.Name != plugin {
			continue
		}
		params := map[string]any{}
		if len(p.Parameters) > 0 {
			if err := json.Unmarshal(p.Parameters, &params); err != nil {
				return false, fmt.Errorf("plugins[%d] (%s): %w", i, plugin, err)
			}
		}
		params[key] = value
		if c.Plugins[i].Parameters, err = json.Marshal(params); err != nil {
			return false, err
		}
		found = true
	}
	return found, nil
}

// Default returns the compiled-in defaults.
func Default() *Config {
	c, err := parse(defaultYAML, nil)
	if err != nil {
		panic("config/default.yaml is invalid: " + err.Error())
	}
	return c
}

// DefaultParameters returns default.yaml's parameters for the named plugin (nil if none).
func DefaultParameters(name string) json.RawMessage {
	for _, p := range Default().Plugins {
		if p.Name == name {
			return p.Parameters
		}
	}
	return nil
}

// Load reads a configuration file on top of the defaults; path "" means the defaults alone.
func Load(path string) (*Config, error) { return LoadOn(path, Default()) }

// Parse reads configuration text on top of the defaults.
func Parse(b []byte) (*Config, error) { return parse(b, Default()) }

// LoadOn reads a configuration file on top of base instead of the compiled-in defaults (a tool
// that runs a picker binary built from another commit layers the user's file on that binary's
// own defaults); path "" returns base.
func LoadOn(path string, base *Config) (*Config, error) {
	if path == "" {
		return base, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	c, err := parse(b, base)
	if err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return c, nil
}

func parse(b []byte, base *Config) (*Config, error) {
	// The reference picker's format (kind: EndpointPickerConfig), translated: endpointpicker.go.
	if base != nil && isEndpointPickerConfig(b) {
		return parseEndpointPickerConfig(b, base)
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return nil, fmt.Errorf("not valid YAML: %w", err)
	}
	c := &Config{}
	if base != nil {
		*c = *base
	}
	if bytes.Equal(bytes.TrimSpace(j), []byte("null")) {
		return c, nil // an empty file
	}
	var generic any
	if err := json.Unmarshal(j, &generic); err != nil {
		return nil, describe(err)
	}
	if err := checkFields(generic, reflect.TypeFor[Config](), ""); err != nil {
		return nil, err
	}
	// Lists replace the defaults' lists; encoding/json would decode into their old elements.
	c.Plugins, c.Pool.Endpoints = nil, nil
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		return nil, describe(err)
	}
	if dec.More() {
		return nil, fmt.Errorf("more than one YAML document")
	}
	if base != nil {
		if c.Plugins == nil {
			c.Plugins = base.Plugins
		}
		if c.Pool.Endpoints == nil {
			c.Pool.Endpoints = base.Pool.Endpoints
		}
	}
	return c, c.Validate()
}

// describe rewrites encoding/json's errors in the config file's terms.
func describe(err error) error {
	if te, ok := err.(*json.UnmarshalTypeError); ok {
		return fmt.Errorf("%s: want %s, got %s", te.Field, te.Type, te.Value)
	}
	// "json: unknown field \"x\"" → "unknown field \"x\""
	return fmt.Errorf("%s", bytes.TrimPrefix([]byte(err.Error()), []byte("json: ")))
}

// Validate checks the fields that do not depend on plugins; plugins are checked when built.
func (c *Config) Validate() error {
	switch {
	case c.ExtProc.MaxBodyBytes < 1:
		return fmt.Errorf("extProc.maxBodyBytes %d: want at least 1", c.ExtProc.MaxBodyBytes)
	case c.ExtProc.MaxBodyBytes > 1<<30:
		return fmt.Errorf("extProc.maxBodyBytes %d: over the supported 1 GiB", c.ExtProc.MaxBodyBytes)
	case c.ExtProc.ChunkBytes < 1024 || c.ExtProc.ChunkBytes > 65536:
		return fmt.Errorf("extProc.chunkBytes %d: want 1024..65536 (proxies cap chunks at 64 KiB)", c.ExtProc.ChunkBytes)
	case c.ExtProc.Fallbacks < 0 || c.ExtProc.Fallbacks > 16:
		return fmt.Errorf("extProc.fallbacks %d: want 0..16", c.ExtProc.Fallbacks)
	case c.Pool.HealthCheck.Interval < 0:
		return fmt.Errorf("pool.healthCheck.interval %v: must not be negative (0 disables)", c.Pool.HealthCheck.Interval.D())
	case c.Pool.HealthCheck.Interval > 0 && (c.Pool.HealthCheck.Timeout <= 0 || c.Pool.HealthCheck.Timeout > c.Pool.HealthCheck.Interval):
		return fmt.Errorf("pool.healthCheck.timeout %v: want more than 0 and at most the interval", c.Pool.HealthCheck.Timeout.D())
	case c.Pool.HealthCheck.Interval > 0 && !strings.HasPrefix(c.Pool.HealthCheck.Path, "/"):
		return fmt.Errorf("pool.healthCheck.path %q: want an absolute path such as /health", c.Pool.HealthCheck.Path)
	case c.Pool.HealthCheck.UnhealthyThreshold < 1 || c.Pool.HealthCheck.HealthyThreshold < 1:
		return fmt.Errorf("pool.healthCheck thresholds must be at least 1")
	case !slices.Contains(BodyModes, c.ExtProc.AssumedBodyMode):
		return fmt.Errorf("extProc.assumedBodyMode %q: want one of %s", c.ExtProc.AssumedBodyMode, strings.Join(BodyModes, ", "))
	}
	if err := c.Pool.Metrics.validate(); err != nil {
		return err
	}
	if err := c.validateProcess(); err != nil {
		return err
	}
	seen := map[string]bool{}
	for i, p := range c.Plugins {
		if p.Name == "" {
			return fmt.Errorf("plugins[%d]: name is required", i)
		}
		if seen[p.Name] {
			return fmt.Errorf("plugins[%d]: %q is listed twice", i, p.Name)
		}
		seen[p.Name] = true
	}
	return nil
}
