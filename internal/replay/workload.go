package replay

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/kvpick/kvpick/internal/engine"
)

// Request is one HTTP request of a workload: what the proxy receives (Path, Body) and what the
// model server makes of it (Prompt, MaxTokens, CacheSalt: the engine's parse of Body).
type Request struct {
	// ID is the request's index in Workload.Requests.
	ID   int
	Path string
	Body []byte

	Prompt    []uint32
	MaxTokens int
	CacheSalt string
	// Stream is the body's "stream"; IncludeUsage its stream_options.include_usage: whether the
	// server answers with SSE events (headers at once) or one JSON body at the end, and whether
	// a stream ends with a usage chunk.
	Stream, IncludeUsage bool

	// At is when the request arrives, from the start of the run (simulated time), unless After
	// is set.
	At time.Duration
	// After, when >= 0, makes the request a follow-up (closed loop): it arrives Think after
	// request After has ended (its response complete, or failed), as the next turn of a chat or
	// the next step of an agent does. At is then only the time it was generated for.
	After int
	Think time.Duration

	// Group names what the request shares its prefix with (a system prompt, a session, a task);
	// -1 when nothing. For tests and diagnostics.
	Group int
	// Fail makes the model server fail the request with 500 before any output (error
	// injection): the same requests fail under every policy.
	Fail bool
}

// Workload is a replayable list of requests.
type Workload struct {
	Name     string
	About    string
	Requests []Request
	// Rate is the arrival rate the workload was generated for, requests per second of
	// simulated time (for a trace: its mean rate).
	Rate float64
	// Params are the generator's parameters, for the report.
	Params map[string]any
}

// Spec sizes a generated workload.
type Spec struct {
	Seed uint64
	// Engines is the pool size the workload is scaled for (default 8).
	Engines int
	// Requests is the number of requests; 0 means the workload's default for Engines.
	Requests int
	// Rate is the arrival rate in requests per second of simulated time; 0 means the workload's
	// default for Engines (chosen to keep the pool busy, not overloaded, under round-robin).
	Rate float64
	// ErrorRate is the fraction of requests that fail with 500 before any output.
	ErrorRate float64
	// Streaming is the mix of streamed and non-streamed requests; nil means DefaultStreaming.
	Streaming *StreamMix
	// Engine is the engines' configuration; its Seed decides the answers the next turns carry.
	// Zero means EngineConfig().
	Engine engine.Config
}

// StreamMix is how a generated workload's clients ask for their answers.
type StreamMix struct {
	// Fraction of requests with "stream": true; the rest get one JSON body at the end.
	Fraction float64 `json:"streamFraction"`
	// UsageFraction of the streamed requests that set stream_options.include_usage (the others'
	// streams carry no usage report).
	UsageFraction float64 `json:"includeUsageFraction"`
}

// DefaultStreaming resembles interactive chat traffic behind a gateway: chat front ends and
// SDK chat loops stream (time to first token is what users see), batch jobs, evaluation
// harnesses and many tool-calling agents do not, hence 80% streamed. Of the streams, half ask
// for the usage chunk: the OpenAI SDKs only send stream_options when the caller sets it, which
// front ends that display token counts do and plain chat loops do not. So 60% of responses
// carry a usage report (every non-streamed one and half the streams).
var DefaultStreaming = StreamMix{Fraction: 0.8, UsageFraction: 0.5}

func (m StreamMix) validate() error {
	if !(m.Fraction >= 0 && m.Fraction <= 1) || !(m.UsageFraction >= 0 && m.UsageFraction <= 1) {
		return fmt.Errorf("stream fractions %v, %v: want 0..1", m.Fraction, m.UsageFraction)
	}
	return nil
}

type workloadDef struct {
	name  string
	about string
	// perEngineRequests and perEngineRate are the defaults per engine of the pool.
	perEngineRequests int
	perEngineRate     float64
	gen               func(g *gen) error
}

var workloadDefs = []workloadDef{
	{"shared-prefix", "groups of questions behind long system prompts (llm-d's prefix benchmark, scaled down)",
		200, 3.6, genSharedPrefix},
	// multi-turn runs at 3/s per engine, below the others' utilisation: its limit is KV memory,
	// not compute. Each running turn holds its whole conversation (~3,000 tokens) in the
	// engine's cache; at 5/s per engine the running turns alone take most of each engine's
	// 4,096 blocks and every policy thrashes (the precise oracle's hit ratio falls from 88% to
	// 74%), which the engines' 6x smaller memory causes, not the load: real servers at that
	// rate have the memory to spare (docs/benchmarks.md has the sweep).
	{"multi-turn", "chat sessions; each turn re-sends the conversation with the previous answer",
		300, 3.0, genMultiTurn},
	{"agent", "agent loops: long tool definitions, each step appends a tool call and its result",
		250, 3.2, genAgent},
	{"hot-prefix", "one long prefix shared by every request, short unique suffixes",
		200, 6.5, genHotPrefix},
	{"no-sharing", "unique prompts with ShareGPT-like lengths (log-normal input ~300, output ~200 tokens)",
		200, 8.0, genNoSharing},
}

// Workloads lists the generated workloads' names, in report order.
func Workloads() []string {
	out := make([]string, len(workloadDefs))
	for i, d := range workloadDefs {
		out[i] = d.name
	}
	return out
}

// DefaultSize returns a workload's default request count and rate for a pool of engines.
func DefaultSize(name string, engines int) (requests int, rate float64, err error) {
	for _, d := range workloadDefs {
		if d.name == name {
			if engines < 1 {
				engines = 8
			}
			return d.perEngineRequests * engines, d.perEngineRate * float64(engines), nil
		}
	}
	return 0, 0, fmt.Errorf("unknown workload %q (have %s)", name, strings.Join(Workloads(), ", "))
}

// Generate builds the named workload. It is deterministic: the same Spec gives byte-identical
// bodies and arrival times.
func Generate(name string, spec Spec) (*Workload, error) {
	var def *workloadDef
	for i := range workloadDefs {
		if workloadDefs[i].name == name {
			def = &workloadDefs[i]
		}
	}
	if def == nil {
		return nil, fmt.Errorf("unknown workload %q (have %s)", name, strings.Join(Workloads(), ", "))
	}
	if spec.Engines < 1 {
		spec.Engines = 8
	}
	if spec.Engine.Model == "" {
		spec.Engine = EngineConfig()
	}
	if spec.Requests <= 0 {
		spec.Requests = def.perEngineRequests * spec.Engines
	}
	if spec.Rate <= 0 {
		spec.Rate = def.perEngineRate * float64(spec.Engines)
	}
	if spec.ErrorRate < 0 || spec.ErrorRate > 1 {
		return nil, fmt.Errorf("error rate %v outside [0, 1]", spec.ErrorRate)
	}
	mix := DefaultStreaming
	if spec.Streaming != nil {
		mix = *spec.Streaming
	}
	if err := mix.validate(); err != nil {
		return nil, err
	}
	ans, err := newAnswerer(spec.Engine)
	if err != nil {
		return nil, err
	}
	g := &gen{
		spec: spec,
		rng:  newRand(spec.Seed, name),
		errs: newRand(spec.Seed, name+"/errors"),
		// Its own stream: changing the mix changes no prompt, arrival or failure.
		streams: newRand(spec.Seed, name+"/stream"),
		mix:     mix,
		ans:     ans,
		w: &Workload{Name: name, About: def.about, Rate: spec.Rate, Params: map[string]any{
			"requests": spec.Requests, "rate": spec.Rate, "seed": spec.Seed,
			"streamFraction": mix.Fraction, "includeUsageFraction": mix.UsageFraction,
		}},
	}
	if err := def.gen(g); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return g.w, nil
}

type gen struct {
	spec    Spec
	rng     *rand.Rand
	errs    *rand.Rand
	streams *rand.Rand
	mix     StreamMix
	ans     *answerer
	w       *Workload
}

// chat bodies, marshalled in a fixed field order.
type chatMessage struct {
	Role       string     `json:"role"`
	Content    string     `json:"content"`
	ToolCalls  []toolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

type toolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function functionCall `json:"function"`
}

type functionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type chatBody struct {
	Model         string            `json:"model"`
	Messages      []chatMessage     `json:"messages"`
	Tools         []json.RawMessage `json:"tools,omitempty"`
	MaxTokens     int               `json:"max_tokens"`
	Stream        bool              `json:"stream"`
	StreamOptions *streamOptions    `json:"stream_options,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// add appends a chat request built from messages; it returns the request's index.
func (g *gen) add(msgs []chatMessage, tools []json.RawMessage, maxTokens int, at time.Duration, after int,
	think time.Duration, group int) (int, error) {
	// Two draws per request whatever the mix, so the choices depend only on the seed.
	stream := g.streams.Float64() < g.mix.Fraction
	usage := g.streams.Float64() < g.mix.UsageFraction
	b := chatBody{Model: g.spec.Engine.Model, Messages: msgs, Tools: tools, MaxTokens: maxTokens, Stream: stream}
	if stream && usage {
		b.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	body, err := json.Marshal(b)
	if err != nil {
		return 0, err
	}
	r := Request{Path: "/v1/chat/completions", Body: body, At: at, After: after, Think: think, Group: group}
	if err := g.addRequest(r); err != nil {
		return 0, err
	}
	return len(g.w.Requests) - 1, nil
}

func (g *gen) addRequest(r Request) error {
	api, err := parseBody(r.Path, r.Body)
	if err != nil {
		return err
	}
	r.ID = len(g.w.Requests)
	r.Prompt, r.MaxTokens, r.CacheSalt = api.Prompt, api.MaxTokens, api.CacheSalt
	r.Stream, r.IncludeUsage = api.Stream, api.Stream && api.IncludeUsage
	// Draw for every request, so the failing set depends only on the seed and the rate.
	r.Fail = g.errs.Float64() < g.spec.ErrorRate
	g.w.Requests = append(g.w.Requests, r)
	return nil
}

// parseBody is the model server's parse of a request.
func parseBody(path string, body []byte) (*engine.APIRequest, error) {
	switch {
	case strings.HasSuffix(path, "/v1/chat/completions"):
		return engine.ParseChatCompletion(body)
	case strings.HasSuffix(path, "/v1/completions"):
		return engine.ParseCompletion(body)
	}
	return nil, fmt.Errorf("path %q: only /v1/chat/completions and /v1/completions can be replayed", path)
}

// poisson returns the arrival times of n requests at rate per second.
func (g *gen) poisson(n int, rate float64) []time.Duration {
	out := make([]time.Duration, n)
	t := 0.0
	for i := range out {
		t += g.rng.ExpFloat64() / rate
		out[i] = time.Duration(t * float64(time.Second))
	}
	return out
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// answer is what the engines answer to request id.
func (g *gen) answer(id int) (string, error) {
	r := &g.w.Requests[id]
	return g.ans.answer(r.Prompt, r.MaxTokens)
}

// shared-prefix: G groups, each a system prompt of 3,000-5,000 tokens (12-20 KB) and 5
// questions of 40-120 tokens; each request asks a random group a random one of its questions,
// with 100-200 output tokens. G = requests/16 (100 at the default 1,600 requests), so the
// distinct prefixes total ~25,000 KV blocks: three quarters of the cache of 8 engines, 6× the
// cache of one.
func genSharedPrefix(g *gen) error {
	n := g.spec.Requests
	groups := max(2, n/16)
	const questions = 5
	type group struct {
		system string
		qs     [questions]string
	}
	gs := make([]group, groups)
	for i := range gs {
		r := newRand(g.spec.Seed, fmt.Sprintf("shared-prefix/group/%d", i))
		gs[i].system = fmt.Sprintf("You are assistant %d of the knowledge base. Use only the documents below.\n\n", i) +
			text(r, uniform(r, 3000, 5000))
		for q := range gs[i].qs {
			gs[i].qs[q] = text(r, uniform(r, 40, 120)) + "?"
		}
	}
	g.w.Params["groups"], g.w.Params["questionsPerGroup"] = groups, questions
	for _, at := range g.poisson(n, g.spec.Rate) {
		gi, q := g.rng.IntN(groups), g.rng.IntN(questions)
		msgs := []chatMessage{{Role: "system", Content: gs[gi].system}, {Role: "user", Content: gs[gi].qs[q]}}
		if _, err := g.add(msgs, nil, uniform(g.rng, 100, 200), at, -1, 0, gi); err != nil {
			return err
		}
	}
	return nil
}

// multi-turn: chat sessions of 3-9 turns behind one of 8 system prompts (500-1,500 tokens).
// The first user message is log-normal around 800 tokens (a pasted document, an email thread),
// later ones around 150; answers around 250 tokens. Each turn re-sends the whole conversation
// with the engine's own previous answer, and arrives 0.3-10 s (exponential, mean 2 s) after the
// previous answer ended. Conversations grow to ~5,000 tokens (300 KV blocks), so an engine's
// cache holds a dozen of them: capacity matters. Sessions start at rate/6 per second, so that
// in steady state requests arrive at about the rate.
func genMultiTurn(g *gen) error {
	n := g.spec.Requests
	const personas, meanTurns = 8, 6.0
	systems := make([]string, personas)
	for i := range systems {
		r := newRand(g.spec.Seed, fmt.Sprintf("multi-turn/persona/%d", i))
		systems[i] = fmt.Sprintf("You are a helpful assistant, persona %d.\n", i) + text(r, uniform(r, 500, 1500))
	}
	starts := g.poisson(n, g.spec.Rate/meanTurns)
	sessions := 0
	for s := 0; len(g.w.Requests) < n; s++ {
		sessions++
		turns := min(uniform(g.rng, 3, 9), n-len(g.w.Requests))
		msgs := []chatMessage{{Role: "system", Content: systems[g.rng.IntN(personas)]}}
		prev := -1
		at := starts[s]
		var think time.Duration
		for t := range turns {
			ulen := logNormal(g.rng, 150, 0.8, 10, 1500)
			if t == 0 {
				ulen = logNormal(g.rng, 800, 0.8, 50, 6000)
			}
			msgs = append(msgs, chatMessage{Role: "user", Content: text(g.rng, ulen)})
			maxTok := logNormal(g.rng, 250, 0.5, 50, 1000)
			id, err := g.add(msgs, nil, maxTok, at, prev, think, s)
			if err != nil {
				return err
			}
			if t+1 < turns {
				a, err := g.answer(id)
				if err != nil {
					return err
				}
				msgs = append(msgs, chatMessage{Role: "assistant", Content: a})
			}
			think = seconds(min(10, max(0.3, g.rng.ExpFloat64()*2)))
			at += think + 5*time.Second
			prev = id
		}
	}
	g.w.Params["sessions"], g.w.Params["personas"] = sessions, personas
	return nil
}

// agent: 4 agent types, each with a system prompt and 14-22 tool definitions (~3,500 tokens in
// all). A task starts with a user request (~150 tokens); each of its 4-14 steps asks the model for
// the next tool call (25-90 output tokens), then appends that call and the tool's result
// (log-normal around 250 tokens) and asks again after the tool ran (exponential, mean 1.5 s).
// Tasks start at rate/9 per second.
func genAgent(g *gen) error {
	n := g.spec.Requests
	const agents, meanSteps = 4, 9.0
	type agent struct {
		system string
		tools  []json.RawMessage
		names  []string
	}
	as := make([]agent, agents)
	for i := range as {
		r := newRand(g.spec.Seed, fmt.Sprintf("agent/type/%d", i))
		as[i].system = fmt.Sprintf("You are agent %d. Solve the task step by step with the tools; call one tool at a time.\n", i) +
			text(r, uniform(r, 200, 400))
		for k := range uniform(r, 14, 22) {
			name := fmt.Sprintf("tool_%d_%d_%s", i, k, strings.ToLower(text(r, 2)[:3]))
			props := map[string]any{}
			var required []string
			for a := range uniform(r, 2, 5) {
				arg := fmt.Sprintf("arg%d", a)
				props[arg] = map[string]any{"type": []string{"string", "integer", "boolean"}[r.IntN(3)],
					"description": text(r, uniform(r, 15, 40))}
				required = append(required, arg)
			}
			tool, err := json.Marshal(map[string]any{"type": "function", "function": map[string]any{
				"name": name, "description": text(r, uniform(r, 40, 120)),
				"parameters": map[string]any{"type": "object", "properties": props, "required": required},
			}})
			if err != nil {
				return err
			}
			as[i].tools = append(as[i].tools, tool)
			as[i].names = append(as[i].names, name)
		}
	}
	starts := g.poisson(n, g.spec.Rate/meanSteps)
	tasks := 0
	for s := 0; len(g.w.Requests) < n; s++ {
		tasks++
		steps := min(uniform(g.rng, 4, 14), n-len(g.w.Requests))
		a := &as[g.rng.IntN(agents)]
		msgs := []chatMessage{{Role: "system", Content: a.system}, {Role: "user", Content: text(g.rng, logNormal(g.rng, 150, 0.6, 20, 1000))}}
		prev := -1
		at := starts[s]
		var think time.Duration
		for k := range steps {
			maxTok := uniform(g.rng, 25, 90)
			id, err := g.add(msgs, a.tools, maxTok, at, prev, think, s)
			if err != nil {
				return err
			}
			if k+1 < steps {
				out, err := g.answer(id)
				if err != nil {
					return err
				}
				callID := fmt.Sprintf("call_%d_%d", s, k)
				args, _ := json.Marshal(map[string]string{"arg0": text(g.rng, uniform(g.rng, 3, 12))})
				msgs = append(msgs,
					chatMessage{Role: "assistant", Content: out, ToolCalls: []toolCall{{ID: callID, Type: "function",
						Function: functionCall{Name: a.names[g.rng.IntN(len(a.names))], Arguments: string(args)}}}},
					chatMessage{Role: "tool", ToolCallID: callID, Content: text(g.rng, logNormal(g.rng, 700, 0.9, 20, 4000))})
			}
			think = seconds(min(20, max(0.05, g.rng.ExpFloat64()*1.5)))
			at += think + time.Second
			prev = id
		}
	}
	g.w.Params["tasks"], g.w.Params["agentTypes"] = tasks, agents
	return nil
}

// hot-prefix: one system prompt of 3,000 tokens shared by every request, then a unique user
// message (log-normal around 60 tokens) and around 250 output tokens.
func genHotPrefix(g *gen) error {
	r := newRand(g.spec.Seed, "hot-prefix/system")
	system := "You are the assistant of a large online shop. Policies and catalogue follow.\n\n" + text(r, 3000)
	for _, at := range g.poisson(g.spec.Requests, g.spec.Rate) {
		msgs := []chatMessage{{Role: "system", Content: system},
			{Role: "user", Content: text(g.rng, logNormal(g.rng, 60, 0.6, 8, 400))}}
		if _, err := g.add(msgs, nil, logNormal(g.rng, 250, 0.5, 16, 1000), at, -1, 0, 0); err != nil {
			return err
		}
	}
	return nil
}

// no-sharing: unique single-message prompts, input log-normal with median 300 tokens
// (σ = 1: p90 ~1,100, p99 ~3,000, capped at 8,000), output median 200 (σ = 0.7, capped at
// 1,500), like ShareGPT.
func genNoSharing(g *gen) error {
	for i, at := range g.poisson(g.spec.Requests, g.spec.Rate) {
		msgs := []chatMessage{{Role: "user", Content: fmt.Sprintf("[%d] ", i) + text(g.rng, logNormal(g.rng, 300, 1.0, 8, 8000))}}
		if _, err := g.add(msgs, nil, logNormal(g.rng, 200, 0.7, 4, 1500), at, -1, 0, -1); err != nil {
			return err
		}
	}
	return nil
}
