package compatflags

import (
	"flag"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap/zapcore"
)

// newSet mimics the picker: its own flags first, then Register.
func newSet() (*flag.FlagSet, *Set, *string, *int) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	pool := fs.String("pool-name", "", "")
	port := fs.Int("grpc-port", 9002, "")
	fs.Duration("refresh-metrics-interval", 0, "the picker's own")
	fs.Bool("enable-pprof", false, "the picker's own")
	return fs, Register(fs), pool, port
}

func TestReferenceChartCommandLineParses(t *testing.T) {
	// The reference inferencepool chart's args, plus common inferenceExtension.flags entries.
	args := []string{
		"--pool-name", "llama",
		"--zap-encoder", "json", "-v", "3",
		"--total-queued-requests-metric", "nv_trt_llm_request_metrics{request_type=waiting}",
		"--kv-cache-usage-percentage-metric", "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}",
		"--lora-info-metric", "",
		"--tracing=false", "--metrics-endpoint-auth=false", "--enable-pprof",
		"--refresh-metrics-interval", "50ms",
	}
	fs, s, pool, _ := newSet()
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse: %v", err)
	}
	if fs.NArg() != 0 {
		t.Fatalf("left over: %v", fs.Args())
	}
	lg, err := s.Check()
	if err != nil {
		t.Fatal(err)
	}
	if *pool != "llama" || lg.Encoding != "json" || lg.Level == nil || *lg.Level != zapcore.InfoLevel {
		t.Fatalf("pool %q, logging %+v", *pool, lg)
	}
	want := []string{"kv-cache-usage-percentage-metric", "lora-info-metric", "metrics-endpoint-auth", "total-queued-requests-metric", "tracing"}
	if got := s.IgnoredSet(); !slices.Equal(got, want) {
		t.Fatalf("ignored = %v, want %v (refresh-metrics-interval and enable-pprof are the picker's own flags, not ignored)", got, want)
	}
}

func TestLoggingFlagsMapToZap(t *testing.T) {
	debug, info, errl := zapcore.DebugLevel, zapcore.InfoLevel, zapcore.ErrorLevel
	tests := []struct {
		args     []string
		encoding string
		level    *zapcore.Level
		err      string
	}{
		{nil, "json", nil, ""},
		{[]string{"--zap-encoder=console"}, "console", nil, ""},
		{[]string{"-v", "4"}, "json", &debug, ""},
		{[]string{"-v=2"}, "json", &info, ""},
		{[]string{"--zap-log-level=error"}, "json", &errl, ""},
		{[]string{"--zap-log-level=5"}, "json", &debug, ""},
		{[]string{"--zap-devel"}, "console", &debug, ""},
		{[]string{"--zap-devel", "--zap-encoder=json"}, "json", &debug, ""},
		{[]string{"--zap-encoder=xml"}, "", nil, "--zap-encoder"},
		{[]string{"-v", "loud"}, "", nil, "-v"},
		{[]string{"--zap-log-level=chatty"}, "", nil, "--zap-log-level"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			fs, s, _, _ := newSet()
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			lg, err := s.Check()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if lg.Encoding != tc.encoding || (lg.Level == nil) != (tc.level == nil) || (lg.Level != nil && *lg.Level != *tc.level) {
				t.Fatalf("logging = %+v (level %v), want %s %v", lg, lg.Level, tc.encoding, tc.level)
			}
		})
	}
}

func TestRejectedFlagsSayWhy(t *testing.T) {
	for name, why := range Rejected {
		t.Run(name, func(t *testing.T) {
			fs, s, _, _ := newSet()
			if err := fs.Parse([]string{"--" + name, "app=vllm"}); err != nil {
				t.Fatal(err)
			}
			_, err := s.Check()
			if err == nil || !strings.Contains(err.Error(), "--"+name) || !strings.Contains(err.Error(), why) {
				t.Fatalf("err = %v", err)
			}
		})
	}
}

func TestCamelCaseAliasesSetThePickersFlags(t *testing.T) {
	fs, _, pool, port := newSet()
	if err := fs.Parse([]string{"-poolName", "p1", "-grpcPort", "9100"}); err != nil {
		t.Fatal(err)
	}
	if *pool != "p1" || *port != 9100 {
		t.Fatalf("pool %q port %d", *pool, *port)
	}
	// An alias of a flag the picker does not define is not registered.
	if fs.Lookup("metricsPort") != nil {
		t.Fatal("metricsPort registered without a metrics-port flag")
	}
}

func TestBooleanIgnoredFlagsRejectNonBooleans(t *testing.T) {
	fs, _, _, _ := newSet()
	if err := fs.Parse([]string{"--tracing=maybe"}); err == nil {
		t.Fatal("--tracing=maybe accepted")
	}
}

func TestPickerFlagsAreNeverShadowed(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	mine := fs.Bool("tracing", true, "the picker's own")
	s := Register(fs)
	if err := fs.Parse([]string{"--tracing=false"}); err != nil {
		t.Fatal(err)
	}
	if *mine || slices.Contains(s.IgnoredSet(), "tracing") {
		t.Fatal("the picker's own --tracing was shadowed by the compatibility flag")
	}
}

// docs/deploy.md's table is what a user migrating from the reference chart reads: it must name
// every flag this package accepts, ignores or refuses.
func TestDeployGuideListsEveryFlag(t *testing.T) {
	b, err := os.ReadFile("../../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	var names []string
	for _, f := range Ignored {
		names = append(names, "`--"+f.Name+"`")
	}
	for name := range Rejected {
		names = append(names, "`--"+name+"`")
	}
	for alias := range Aliases {
		names = append(names, "`-"+alias+"`")
	}
	names = append(names, "`--zap-encoder`", "`-v`", "`--zap-log-level`", "`--zap-devel`")
	for _, n := range names {
		if !strings.Contains(doc, n) {
			t.Errorf("docs/deploy.md does not mention %s", n)
		}
	}
}
