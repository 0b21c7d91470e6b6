// Command simserver is a simulated vLLM model server: an OpenAI-compatible
// HTTP API with vLLM's /metrics, backed by internal/engine's model of batching,
// prefix caching and timing. Tests, the demo and benchmarks run a pool of
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
	addr := fs.String("addr", "127.0.0.1:8000", "listen address (host:port)")
	model := fs.String("model", def.Model, "served model name; requests for any other model get 400")
	blocks := fs.Int("num-gpu-blocks", def.NumGPUBlocks, "KV cache capacity in blocks (vllm:cache_config_info num_gpu_blocks)")
	blockSize := fs.Int("block-size", def.BlockSize, "tokens per KV block")
	maxSeqs := fs.Int("max-num-seqs", def.MaxNumSeqs, "batch limit: requests running at once; more wait in a FIFO queue")
	maxWaiting := fs.Int("max-waiting", def.MaxWaiting, "answer 503 when this many requests already wait (0: no limit)")
	maxLen := fs.Int("max-model-len", 0, "limit on prompt + output tokens (0: num-gpu-blocks × block-size)")
	prefillUS := fs.Float64("prefill-us-per-token", float64(def.PrefillPerToken)/1e3, "GPU time to prefill one uncached prompt token, in µs; prefills run one after another")
	overheadMS := fs.Float64("prefill-overhead-ms", float64(def.PrefillOverhead)/1e6, "fixed time added to every prefill, in ms")
	decodeMS := fs.Float64("decode-ms-per-token", float64(def.DecodePerToken)/1e6, "time between output tokens with a batch of one, in ms")
	penalty := fs.Float64("decode-batch-penalty", def.DecodeBatchPenalty, "a full batch decodes (1 + this) times slower than a batch of one")
	outMin := fs.Int("output-tokens-min", def.OutputTokensMin, "shortest output when a request gives no max_tokens (length from the prompt's hash)")
	outMax := fs.Int("output-tokens-max", def.OutputTokensMax, "longest output when a request gives no max_tokens")
	errRate := fs.Float64("error-rate", 0, "fraction of requests that fail with 500 before any output")
	slowRate := fs.Float64("slow-rate", 0, "fraction of requests that run slow-factor times slower")
	slowFactor := fs.Float64("slow-factor", def.SlowFactor, "slowdown of slow requests (prefill wait and decode)")
	hangRate := fs.Float64("hang-rate", 0, "fraction of requests that are accepted but never answered until the client goes away")
	seed := fs.Uint64("seed", def.Seed, "seed for failure injection (reproducible for a given arrival order)")
	alwaysUsage := fs.Bool("always-usage", true, "end every stream with a usage chunk, as if stream_options.include_usage were set")
	chunkTokens := fs.Int("stream-chunk-tokens", 4, "output tokens per streamed SSE chunk")
	servedBy := fs.String("served-by", "", "value of the x-served-by response header (default: the address the request arrived on)")
	logLevel := fs.String("log-level", "info", "log level: debug (one line per request), info, warn, error")
	shutdown := fs.Duration("shutdown-timeout", 10*time.Second, "on SIGINT/SIGTERM, how long to let running requests finish before closing connections")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
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
		Model:              *model,
		BlockSize:          *blockSize,
		NumGPUBlocks:       *blocks,
		MaxNumSeqs:         *maxSeqs,
		MaxWaiting:         *maxWaiting,
		MaxModelLen:        *maxLen,
		PrefillPerToken:    time.Duration(*prefillUS * 1e3),
		PrefillOverhead:    time.Duration(*overheadMS * 1e6),
		DecodePerToken:     time.Duration(*decodeMS * 1e6),
		DecodeBatchPenalty: *penalty,
		OutputTokensMin:    *outMin,
		OutputTokensMax:    *outMax,
		ErrorRate:          *errRate,
		SlowRate:           *slowRate,
		SlowFactor:         *slowFactor,
		HangRate:           *hangRate,
		Seed:               *seed,
	}
	eng, err := engine.New(cfg, engine.RealClock{})
	if err != nil {
		return err
	}
	handler := httpserver.New(eng, httpserver.Options{
		ServedBy:    *servedBy,
		AlwaysUsage: *alwaysUsage,
		ChunkTokens: *chunkTokens,
		Logger:      log,
	})

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	log.Info("serving", zap.String("addr", ln.Addr().String()), zap.String("model", cfg.Model),
		zap.Int("num_gpu_blocks", cfg.NumGPUBlocks), zap.Int("block_size", cfg.BlockSize),
		zap.Int("max_num_seqs", cfg.MaxNumSeqs))
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
