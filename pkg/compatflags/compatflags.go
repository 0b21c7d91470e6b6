// Package compatflags lets the picker start with the command line the reference endpoint
// picker's Helm chart (gateway-api-inference-extension's inferencepool chart) gives its image,
// so that swapping the image in that chart works. Flags that map to the picker's own are
// honoured (logging: --zap-encoder, -v, --zap-log-level, --zap-devel; the reference's older
// camelCase names of the flags the picker shares); flags for features the picker does not have,
// or does differently, are accepted and ignored, named in one log line; flags whose meaning
// cannot be ignored safely (another discovery mode, another configuration format) are errors
// that say so. docs/deploy.md lists them all.
//
// Register after the picker's own flags: a flag the picker defines itself is left alone, so
// a flag it gains later stops being ignored without a change here. The picker's own flags that
// the reference chart also passes (--refresh-metrics-interval, --metrics-staleness-threshold,
// --enable-pprof, the pool and port flags) are not listed here.
package compatflags

import (
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"go.uber.org/zap/zapcore"
)

type kind int

const (
	str kind = iota
	boolean
)

// Ignored lists the reference picker's flags that are accepted and ignored, with what takes
// their place here.
var Ignored = []struct {
	Name, Instead string
	bool          bool
}{
	{Name: "total-queued-requests-metric", Instead: "pool.metrics in the config file (engine auto-detects vLLM and SGLang; engine: custom with names for others)"},
	{Name: "total-running-requests-metric", Instead: "pool.metrics in the config file"},
	{Name: "kv-cache-usage-percentage-metric", Instead: "pool.metrics in the config file"},
	{Name: "lora-info-metric", Instead: "pool.metrics in the config file"},
	{Name: "cache-info-metric", Instead: "pool.metrics in the config file"},
	{Name: "refresh-prometheus-metrics-interval", Instead: "none: the picker's own metrics are computed at scrape time"},
	{Name: "model-server-metrics-path", Instead: "pool.metrics.path in the config file"},
	{Name: "model-server-metrics-scheme", Instead: "none: model servers are scraped over HTTP"},
	{Name: "model-server-metrics-https-insecure-skip-verify", Instead: "none", bool: true},
	{Name: "plugin-state-staleness-threshold", Instead: "none: per-request state ends with its stream"},
	{Name: "tracing", Instead: "none: no tracing", bool: true},
	{Name: "health-checking", Instead: "none: gRPC health is always served", bool: true},
	{Name: "enable-cert-reload", Instead: "none: restart the picker to load new certificates", bool: true},
	{Name: "metrics-endpoint-auth", Instead: "none: /metrics is served without authentication; restrict it with a NetworkPolicy", bool: true},
	{Name: "metrics-client-ca-file", Instead: "none"},
	{Name: "metrics-cert-dir", Instead: "none: /metrics is plain HTTP"},
	{Name: "enable-grpc-stream-metrics", Instead: "none: ext_proc stream metrics are always exported", bool: true},
	{Name: "fairness-id-metric-label-limit", Instead: "none: no per-fairness-id metrics"},
	{Name: "grpc-max-recv-msg-size", Instead: "extProc.maxBodyBytes in the config file"},
	{Name: "grpc-max-send-msg-size", Instead: "extProc.chunkBytes in the config file"},
	{Name: "tls-min-version", Instead: "none: TLS 1.2 or later"},
	{Name: "tls-cipher-suites", Instead: "none: Go's default suites"},
	{Name: "disable-endpoint-subset-filter", Instead: "remove subset-filter from plugins in the config file", bool: true},
	{Name: "emit-endpoint-scores", Instead: "none", bool: true},
	{Name: "feature-gates", Instead: "none"},
	{Name: "allow-experimental-plugins", Instead: "none", bool: true},
	{Name: "zap-stacktrace-level", Instead: "none: stack traces only on panics"},
	{Name: "zap-time-encoding", Instead: "none: ISO-8601 times in JSON, epoch in console"},
	{Name: "enable-leader-election", Instead: "--ha-enable-leader-election", bool: true},
}

// Rejected lists the reference picker's flags that cannot be ignored without doing something
// else than the user asked.
var Rejected = map[string]string{
	"endpoint-selector":     "standalone discovery by label selector is not supported: create an InferencePool and pass --pool-name",
	"endpoint-target-ports": "standalone discovery by label selector is not supported: create an InferencePool and pass --pool-name",
	"config-text":           "inline configuration is not supported: mount the configuration as a file and pass --config-file",
}

// Aliases maps the reference picker's older camelCase flag names to the picker's.
var Aliases = map[string]string{
	"poolName":       "pool-name",
	"poolNamespace":  "pool-namespace",
	"grpcPort":       "grpc-port",
	"grpcHealthPort": "grpc-health-port",
	"metricsPort":    "metrics-port",
	"certPath":       "cert-path",
	"secureServing":  "secure-serving",
	"configFile":     "config-file",
}

// Set holds the compatibility flags registered on one FlagSet.
type Set struct {
	fs       *flag.FlagSet
	ignored  []string // registered by this package, in Ignored's order
	rejected []string // registered by this package
	verbose  string
	encoder  string
	level    string
	devel    bool
}

// Register adds the compatibility flags that fs does not define yet.
func Register(fs *flag.FlagSet) *Set {
	s := &Set{fs: fs}
	def := func(name string) bool { return fs.Lookup(name) == nil }
	for _, f := range Ignored {
		if !def(f.Name) {
			continue
		}
		k := str
		if f.bool {
			k = boolean
		}
		fs.Var(&ignoredValue{kind: k}, f.Name, "accepted for the reference endpoint picker's chart and ignored; instead: "+f.Instead)
		s.ignored = append(s.ignored, f.Name)
	}
	for name, why := range Rejected {
		if def(name) {
			fs.Var(&ignoredValue{}, name, "not supported: "+why)
			s.rejected = append(s.rejected, name)
		}
	}
	for alias, target := range Aliases {
		if t := fs.Lookup(target); t != nil && def(alias) {
			fs.Var(t.Value, alias, "alias of --"+target)
		}
	}
	if def("v") {
		fs.StringVar(&s.verbose, "v", "", "log verbosity of the reference picker: 4 or more logs at debug level, less at info (--log-level takes precedence)")
	}
	if def("zap-encoder") {
		fs.StringVar(&s.encoder, "zap-encoder", "", "log encoding: json (default) or console")
	}
	if def("zap-log-level") {
		fs.StringVar(&s.level, "zap-log-level", "", "log level as the reference picker takes it: debug, info, error, or a verbosity number (--log-level takes precedence)")
	}
	if def("zap-devel") {
		fs.BoolVar(&s.devel, "zap-devel", false, "development logging: console encoding at debug level (--log-level and --zap-encoder take precedence)")
	}
	return s
}

// Logging is what the compatibility flags say about logging, after Parse.
type Logging struct {
	Encoding string         // "json" or "console"
	Level    *zapcore.Level // nil: they say nothing
}

// Check returns an error for a rejected flag that was set, and otherwise the logging settings
// the flags map to.
func (s *Set) Check() (Logging, error) {
	var err error
	s.fs.Visit(func(f *flag.Flag) {
		if err == nil && slices.Contains(s.rejected, f.Name) {
			err = fmt.Errorf("--%s: %s", f.Name, Rejected[f.Name])
		}
	})
	if err != nil {
		return Logging{}, err
	}
	out := Logging{Encoding: "json"}
	if s.devel {
		out.Encoding = "console"
		l := zapcore.DebugLevel
		out.Level = &l
	}
	switch s.encoder {
	case "":
	case "json", "console":
		out.Encoding = s.encoder
	default:
		return Logging{}, fmt.Errorf("--zap-encoder %q: want json or console", s.encoder)
	}
	if s.verbose != "" {
		n, perr := strconv.Atoi(s.verbose)
		if perr != nil || n < 0 {
			return Logging{}, fmt.Errorf("-v %q: want a verbosity number such as 2 or 4", s.verbose)
		}
		out.Level = verbosity(n)
	}
	if s.level != "" {
		l, perr := zapLevel(s.level)
		if perr != nil {
			return Logging{}, perr
		}
		out.Level = &l
	}
	return out, nil
}

// verbosity maps the reference picker's logr verbosity (2 default, 3 verbose, 4 debug, 5
// trace) to zap: debug from 4.
func verbosity(n int) *zapcore.Level {
	l := zapcore.InfoLevel
	if n >= 4 {
		l = zapcore.DebugLevel
	}
	return &l
}

func zapLevel(s string) (zapcore.Level, error) {
	if n, err := strconv.Atoi(s); err == nil {
		// controller-runtime's zap flag takes a positive verbosity too.
		return *verbosity(n), nil
	}
	var l zapcore.Level
	if err := l.UnmarshalText([]byte(strings.ToLower(s))); err != nil {
		return l, fmt.Errorf("--zap-log-level %q: want debug, info, error or a verbosity number", s)
	}
	return l, nil
}

// IgnoredSet returns the ignored flags the command line set, sorted, for one log line.
func (s *Set) IgnoredSet() []string {
	var out []string
	s.fs.Visit(func(f *flag.Flag) {
		if slices.Contains(s.ignored, f.Name) {
			out = append(out, f.Name)
		}
	})
	slices.Sort(out)
	return out
}

// ignoredValue accepts any value.
type ignoredValue struct {
	kind kind
	val  string
}

func (v *ignoredValue) String() string {
	if v == nil {
		return ""
	}
	return v.val
}

func (v *ignoredValue) Set(s string) error {
	if v.kind == boolean {
		if _, err := strconv.ParseBool(s); err != nil {
			return fmt.Errorf("want true or false")
		}
	}
	v.val = s
	return nil
}

// IsBoolFlag lets a boolean flag be given bare (--tracing) as well as --tracing=false.
func (v *ignoredValue) IsBoolFlag() bool { return v.kind == boolean }
