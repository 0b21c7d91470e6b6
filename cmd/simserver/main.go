// Command simserver is a simulated vLLM model server: an OpenAI-compatible
// HTTP API with vLLM's (or SGLang's) /metrics, backed by internal/engine's
// model of vLLM V1's step scheduler (chunked prefill under a token budget),
// prefix caching, preemption and timing. Tests, the demo and benchmarks run a pool of
// them in place of GPUs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kvpick/kvpick/internal/engine"
	"github.com/kvpick/kvpick/internal/engine/httpserver"
	"github.com/kvpick/kvpick/internal/engine/servermetrics"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "simserver:", err)
		os.Exit(1)
	}
}

// run serves until ctx is done, then shuts down gracefully. ready, if not
// nil, gets the listening address (tests listen on port 0).
func run(ctx context.Context, args []string, stderr io.Writer, ready func(addr string)) error {
	def := engine.DefaultConfig()
	fs := flag.NewFlagSet("simserver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: simserver [flags]

A simulated vLLM (V1) model server: OpenAI's /v1/chat/completions and /v1/completions,
/v1/models, /health and Prometheus /metrics. Each engine step has a token budget
(--max-num-batched-tokens): running requests' decode tokens first, then waiting requests'
prompt chunks; a step lasts --step-overhead-ms + prompt tokens × --prefill-us-per-token + a
decode term (--decode-ms-per-token with one decoding request, × (1 + --decode-batch-penalty)
with a full batch). Streams send their headers at once and an event per token as steps end.

Flags:
`)
		fs.PrintDefaults()
	}
	addr := fs.String("addr", "127.0.0.1:8000", "listen address (host:port)")
	model := fs.String("model", def.Model, "served model name; requests for any other model get 404")
	blocks := fs.Int("num-gpu-blocks", def.NumGPUBlocks, "KV cache capacity in blocks (vllm:cache_config_info num_gpu_blocks)")
	blockSize := fs.Int("block-size", def.BlockSize, "tokens per KV block")
	maxSeqs := fs.Int("max-num-seqs", def.MaxNumSeqs, "batch limit: requests running at once; more wait in a FIFO queue")
	maxBatched := fs.Int("max-num-batched-tokens", def.MaxNumBatchedTokens, "token budget of one engine step (vLLM's max_num_batched_tokens; at least max-num-seqs)")
	maxWaiting := fs.Int("max-waiting", def.MaxWaiting, "answer 503 when this many requests already wait (0: no limit, as vLLM)")
	maxLen := fs.Int("max-model-len", 0, "limit on prompt + output tokens (0: num-gpu-blocks × block-size)")
	overheadMS := fs.Float64("step-overhead-ms", float64(def.StepOverhead)/1e6, "fixed cost of every engine step, in ms")
	prefillUS := fs.Float64("prefill-us-per-token", float64(def.PrefillPerToken)/1e3, "cost of one uncached prompt token in a step, in µs")
	decodeMS := fs.Float64("decode-ms-per-token", float64(def.DecodePerToken)/1e6, "decode cost of a step with one decoding request, in ms (a request alone gets a token every step-overhead-ms + this)")
	penalty := fs.Float64("decode-batch-penalty", def.DecodeBatchPenalty, "a step decoding a full batch costs (1 + this) × decode-ms-per-token")
	outMin := fs.Int("output-tokens-min", def.OutputTokensMin, "shortest output when a request gives no max_tokens (length from the prompt's hash)")
	outMax := fs.Int("output-tokens-max", def.OutputTokensMax, "longest output when a request gives no max_tokens")
	errRate := fs.Float64("error-rate", 0, "fraction of requests that fail with 500 before any output")
	lateErrRate := fs.Float64("late-error-rate", 0, "fraction of requests that fail after half their output (a stream gets an error event)")
	slowRate := fs.Float64("slow-rate", 0, "fraction of requests that get tokens in only one step in slow-factor once admitted")
	slowFactor := fs.Float64("slow-factor", def.SlowFactor, "slowdown of slow requests")
	hangRate := fs.Float64("hang-rate", 0, "fraction of requests that are admitted but never answered until the client goes away")
	seed := fs.Uint64("seed", def.Seed, "seed for failure injection (reproducible for a given arrival order)")
	alwaysUsage := fs.Bool("always-usage", false, "end every stream with a usage chunk, as vLLM's --enable-force-include-usage "+
		"(off, as in vLLM: usage only with stream_options.include_usage)")
	details := fs.Bool("enable-prompt-tokens-details", false, "report usage.prompt_tokens_details.cached_tokens, as vLLM's flag of that name "+
		"(off, as in vLLM)")
	flavorName := fs.String("metrics-flavor", string(servermetrics.VLLM), "names /metrics uses: vllm (vllm:kv_cache_usage_perc, ...), "+
		"vllm-old (vllm:gpu_cache_usage_perc, ..., before vLLM 0.10) or sglang (sglang:num_running_reqs, sglang:token_usage, ...)")
	maxLoRAs := fs.Int("max-loras", 0, "max_lora label of vllm:lora_requests_info (no adapter is ever running)")
	chunkTokens := fs.Int("stream-chunk-tokens", 1, "output tokens per streamed SSE event (vLLM: 1)")
	servedBy := fs.String("served-by", "", "value of the x-served-by response header (default: the address the request arrived on)")
	logLevel := fs.String("log-level", "info", "log level: debug (one line per request), info, warn, error")
	shutdown := fs.Duration("shutdown-timeout", 10*time.Second, "on SIGINT/SIGTERM, how long to let running requests finish before closing connections")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	flavor, err := servermetrics.ParseFlavor(*flavorName)
	if err != nil {
		return err
	}

	lvl, err := zapcore.ParseLevel(*logLevel)
	if err != nil {
		return err
	}
	zcfg := zap.NewProductionConfig()
	zcfg.Level = zap.NewAtomicLevelAt(lvl)
	zcfg.Sampling = nil
	log, err := zcfg.Build()
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	cfg := engine.Config{
		Model:               *model,
		BlockSize:           *blockSize,
		NumGPUBlocks:        *blocks,
		MaxNumSeqs:          *maxSeqs,
		MaxNumBatchedTokens: *maxBatched,
		MaxWaiting:          *maxWaiting,
		MaxModelLen:         *maxLen,
		StepOverhead:        time.Duration(*overheadMS * 1e6),
		PrefillPerToken:     time.Duration(*prefillUS * 1e3),
		DecodePerToken:      time.Duration(*decodeMS * 1e6),
		DecodeBatchPenalty:  *penalty,
		OutputTokensMin:     *outMin,
		OutputTokensMax:     *outMax,
		ErrorRate:           *errRate,
		LateErrorRate:       *lateErrRate,
		SlowRate:            *slowRate,
		SlowFactor:          *slowFactor,
		HangRate:            *hangRate,
		Seed:                *seed,
	}
	eng, err := engine.New(cfg, engine.RealClock{})
	if err != nil {
		return err
	}
	handler := httpserver.New(eng, httpserver.Options{
		ServedBy:                *servedBy,
		AlwaysUsage:             *alwaysUsage,
		HidePromptTokensDetails: !*details,
		ChunkTokens:             *chunkTokens,
		Metrics:                 servermetrics.Options{Flavor: flavor, MaxLoRAs: *maxLoRAs},
		Logger:                  log,
	})

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	log.Info("serving", zap.String("addr", ln.Addr().String()), zap.String("model", cfg.Model),
		zap.Int("num_gpu_blocks", cfg.NumGPUBlocks), zap.Int("block_size", cfg.BlockSize),
		zap.Int("max_num_seqs", cfg.MaxNumSeqs), zap.Int("max_num_batched_tokens", cfg.MaxNumBatchedTokens),
		zap.String("metrics_flavor", string(flavor)))
	if ready != nil {
		ready(ln.Addr().String())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), *shutdown)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// Hung or long requests: close their connections, which cancels
		// them in the engine.
		log.Warn("closing remaining connections", zap.Error(err))
		_ = srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
