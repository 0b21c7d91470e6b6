// Package httpserver serves an engine.Engine over OpenAI's HTTP API, with
// vLLM's /metrics, so that it stands in for one vLLM replica in tests, the
// demo and benchmarks.
package httpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kvpick/kvpick/internal/engine"
	"github.com/kvpick/kvpick/internal/engine/openaiwire"
	"github.com/kvpick/kvpick/internal/engine/servermetrics"
)

// maxBodyBytes bounds request bodies; long-context prompts are large, but
// not this large.
const maxBodyBytes = 64 << 20

// Options configure a Server. The zero value behaves as vLLM's OpenAI
// server with default flags, except PromptTokensDetails (see there).
type Options struct {
	// ServedBy is the x-served-by response header. Empty means the local
	// address the request arrived on, which tells tests which replica
	// answered.
	ServedBy string
	// AlwaysUsage adds the usage chunk to every stream, as if the client
	// had set stream_options.include_usage (vLLM's
	// --enable-force-include-usage). Off, a stream reports usage only when
	// the client asks.
	AlwaysUsage bool
	// HidePromptTokensDetails leaves usage.prompt_tokens_details out, as
	// vLLM does unless started with --enable-prompt-tokens-details
	// (non-streamed answers then carry "prompt_tokens_details": null, a
	// stream's usage chunk no such key). The zero value reports
	// cached_tokens, which the project's tests and demo rely on.
	HidePromptTokensDetails bool
	// ChunkTokens is the number of tokens per streamed event (default 1:
	// vLLM sends an event for every token it produces).
	ChunkTokens int
	// Metrics configures /metrics (names, LoRA label).
	Metrics servermetrics.Options
	// Logger logs each request at debug level; nil logs nothing.
	Logger *zap.Logger
}

// Server is an http.Handler for one engine.
type Server struct {
	eng     *engine.Engine
	clock   engine.Clock
	opts    Options
	log     *zap.Logger
	created int64
	ids     atomic.Uint64
	mux     *http.ServeMux
}

// New returns a handler serving eng.
func New(eng *engine.Engine, opts Options) *Server {
	if opts.ChunkTokens < 1 {
		opts.ChunkTokens = 1
	}
	if opts.Metrics.Started.IsZero() {
		opts.Metrics.Started = eng.Clock().Now()
	}
	s := &Server{eng: eng, clock: eng.Clock(), opts: opts, log: opts.Logger, created: eng.Clock().Now().Unix()}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, true) })
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, false) })
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /metrics", s.metrics)
	mux.HandleFunc("GET /metrics/", s.metrics) // vLLM's mounted metrics application
	for _, p := range []string{"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/metrics/"} {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path))
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	})
	s.mux = mux
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("x-served-by", s.servedBy(r))
	s.mux.ServeHTTP(w, r)
}

func (s *Server) servedBy(r *http.Request) string {
	if s.opts.ServedBy != "" {
		return s.opts.ServedBy
	}
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		return a.String()
	}
	return ""
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeBody(w, status, openaiwire.ErrorBody(status, msg))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	writeBody(w, status, b)
}

func writeBody(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	cfg := s.eng.Config()
	type model struct {
		ID          string `json:"id"`
		Object      string `json:"object"`
		Created     int64  `json:"created"`
		OwnedBy     string `json:"owned_by"`
		Root        string `json:"root"`
		MaxModelLen int    `json:"max_model_len"`
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data":   []model{{ID: cfg.Model, Object: "model", Created: s.created, OwnedBy: "vllm", Root: cfg.Model, MaxModelLen: cfg.MaxModelLen}},
	})
}

// wire renders the response to the request with this id.
func (s *Server) wire(id string, chat bool) openaiwire.Response {
	return openaiwire.Response{ID: id, Model: s.eng.Config().Model, Created: s.clock.Now().Unix(), Chat: chat,
		Details: !s.opts.HidePromptTokensDetails}
}

// progress turns engine callbacks into state a handler goroutine reads: the
// callbacks never block (they run on the engine's delivery goroutine), they
// record and wake the handler.
type progress struct {
	mu       sync.Mutex
	first    *engine.Result
	produced int
	done     *engine.Result
	wake     chan struct{}
}

func newProgress() *progress { return &progress{wake: make(chan struct{}, 1)} }

func (p *progress) notify() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *progress) callbacks() engine.Callbacks {
	return engine.Callbacks{
		FirstToken: func(r engine.Result) {
			p.mu.Lock()
			p.first = &r
			p.mu.Unlock()
			p.notify()
		},
		Token: func(_ engine.Result, i int) {
			p.mu.Lock()
			p.produced = i + 1
			p.mu.Unlock()
			p.notify()
		},
		Done: func(r engine.Result) {
			p.mu.Lock()
			p.done = &r
			p.mu.Unlock()
			p.notify()
		},
	}
}

// snapshot returns what happened so far.
func (p *progress) snapshot() (first *engine.Result, produced int, done *engine.Result) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.first, p.produced, p.done
}

// wait blocks until the request is done or ctx ends.
func (p *progress) wait(ctx context.Context) (engine.Result, bool) {
	for {
		if _, _, done := p.snapshot(); done != nil {
			return *done, true
		}
		select {
		case <-p.wake:
		case <-ctx.Done():
			return engine.Result{}, false
		}
	}
}

func (s *Server) generate(w http.ResponseWriter, r *http.Request, chat bool) {
	start := time.Now()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		writeError(w, http.StatusBadRequest, "reading body: "+err.Error())
		return
	}
	var req *engine.APIRequest
	if chat {
		req, err = engine.ParseChatCompletion(body)
	} else {
		req, err = engine.ParseCompletion(body)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	cfg := s.eng.Config()
	if req.Model != cfg.Model {
		writeError(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", req.Model))
		return
	}
	id := r.Header.Get("x-request-id")
	if id == "" {
		id = strconv.FormatUint(s.ids.Add(1), 16)
	}
	w.Header().Set("x-request-id", id)
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	prog := newProgress()
	// Submit only queues the request: the engine schedules it in a later
	// step, so a stream's headers below go out before any prefill.
	h, err := s.eng.Submit(req.EngineRequest(prefix+id), prog.callbacks())
	if err != nil {
		status := http.StatusInternalServerError
		switch {
		case errors.Is(err, engine.ErrOverloaded):
			status = http.StatusServiceUnavailable
		case errors.Is(err, engine.ErrTooLong), errors.Is(err, engine.ErrEmptyPrompt):
			status = http.StatusBadRequest
		}
		s.log.Debug("request refused", zap.String("id", id), zap.Int("status", status), zap.Error(err))
		writeError(w, status, err.Error())
		return
	}
	// However the handler ends, the engine must let go of the request: a
	// client that went away frees its batch slot and blocks.
	defer h.Cancel()

	var res engine.Result
	var ok bool
	if req.Stream {
		res, ok = s.stream(r.Context(), w, req, h.ID(), chat, prog)
	} else if res, ok = prog.wait(r.Context()); ok {
		s.respond(w, res, chat)
	}
	if !ok {
		s.log.Debug("client went away", zap.String("id", id), zap.Duration("after", time.Since(start)))
		return
	}
	s.log.Debug("request done", zap.String("id", id), zap.Bool("stream", req.Stream), zap.String("outcome", string(res.Outcome)),
		zap.Int("prompt_tokens", res.PromptTokens), zap.Int("cached_tokens", res.CachedTokens),
		zap.Int("completion_tokens", res.CompletionTokens), zap.Duration("ttft", res.TTFT()),
		zap.Duration("latency", time.Since(start)))
}

// failed reports whether res ended without its whole output.
func failed(res engine.Result) bool {
	return res.Outcome != engine.OutcomeStop && res.Outcome != engine.OutcomeLength
}

func (s *Server) respond(w http.ResponseWriter, res engine.Result, chat bool) {
	if failed(res) {
		writeError(w, http.StatusInternalServerError, fmt.Sprintf("the engine failed the request after %d tokens", res.CompletionTokens))
		return
	}
	writeBody(w, http.StatusOK, s.wire(res.ID, chat).Whole(res))
}
