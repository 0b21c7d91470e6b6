package demo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvpick/kvpick/internal/engine"

	"github.com/kvpick/kvpick/internal/textgen"
)

// Workload is a deterministic mix of sessions. A session is a sequence of requests that each
// wait for the previous answer: a multi-turn chat, an agent loop, or a single prompt.
type Workload struct {
	// Chats: multi-turn conversations, spread over SystemPrompts shared system prompts.
	Chats, Turns, SystemPrompts int
	// Agents: tool-using loops of Steps requests whose context grows by a tool result each step.
	Agents, Steps int
	// Unique: one-shot prompts that share nothing.
	Unique int
	// Concurrency: sessions running at once.
	Concurrency int
	// MaxTokens per answer.
	MaxTokens int
	// Seed makes the prompts and the session order reproducible.
	Seed uint64
}

// DefaultWorkload takes ~15-25 s per policy on a 2-core machine.
func DefaultWorkload() Workload {
	return Workload{
		Chats: 48, Turns: 6, SystemPrompts: 4,
		Agents: 8, Steps: 10,
		Unique:      48,
		Concurrency: 12, MaxTokens: 48, Seed: 1,
	}
}

// Requests is the number of requests the workload sends.
func (w Workload) Requests() int { return w.Chats*w.Turns + w.Agents*w.Steps + w.Unique }

func (w Workload) String() string {
	return fmt.Sprintf("%d requests: %d chats × %d turns over %d shared system prompts, %d agent loops × %d steps, %d one-shot prompts; %d sessions at a time",
		w.Requests(), w.Chats, w.Turns, w.SystemPrompts, w.Agents, w.Steps, w.Unique, w.Concurrency)
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// session produces its requests one by one; next gets the previous answer's text.
type session struct {
	kind  string
	steps int
	next  func(step int, prevAnswer string) []message
}

// sessions builds the workload's sessions in a fixed, shuffled order.
func (w Workload) sessions() []session {
	r := rand.New(rand.NewPCG(w.Seed, 0x6b7670))
	text := func(n int) string { return filler(r, n) }
	var out []session
	systems := make([]string, max(w.SystemPrompts, 1))
	for i := range systems {
		systems[i] = fmt.Sprintf("You are assistant #%d of the Acme support team. Policies follow. %s", i, text(300))
	}
	for c := 0; c < w.Chats; c++ {
		sys := systems[c%len(systems)]
		questions := make([]string, w.Turns)
		for k := range questions {
			questions[k] = fmt.Sprintf("Customer %d, message %d: %s", c, k, text(150))
		}
		var history []message
		out = append(out, session{kind: "chat", steps: w.Turns, next: func(k int, prev string) []message {
			if k == 0 {
				history = []message{{Role: "system", Content: sys}}
			} else {
				history = append(history, message{Role: "assistant", Content: prev})
			}
			history = append(history, message{Role: "user", Content: questions[k]})
			return slices.Clone(history)
		}})
	}
	agentSys := "You are a coding agent. Tools: read_file, run_tests, search. Think, then call one tool. " + text(700)
	for a := 0; a < w.Agents; a++ {
		task := fmt.Sprintf("Task %d: %s", a, text(80))
		results := make([]string, w.Steps)
		for k := range results {
			results[k] = fmt.Sprintf("Tool result %d: %s", k, text(300))
		}
		var history []message
		out = append(out, session{kind: "agent", steps: w.Steps, next: func(k int, prev string) []message {
			if k == 0 {
				history = []message{{Role: "system", Content: agentSys}, {Role: "user", Content: task}}
			} else {
				history = append(history, message{Role: "assistant", Content: prev}, message{Role: "user", Content: results[k-1]})
			}
			return slices.Clone(history)
		}})
	}
	for u := 0; u < w.Unique; u++ {
		prompt := fmt.Sprintf("One-off question %d: %s", u, text(250))
		out = append(out, session{kind: "unique", steps: 1, next: func(int, string) []message {
			return []message{{Role: "user", Content: prompt}}
		}})
	}
	r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// filler is n words of internal/textgen's word list.
func filler(r *rand.Rand, n int) string { return textgen.Phrase(r, n) }

// Result is what one run of the workload measured.
type Result struct {
	Policy      string
	Requests    int
	Errors      int
	FirstError  string
	PerEndpoint []int // requests answered by each simulator, in pool order
	// HitRate is the simulators' own prefix-cache hit rate: Σ hits / Σ queries, in tokens.
	HitRate float64
	// Computed is the prompt tokens the simulators had to prefill (not cached): GPU work.
	Computed uint64
	// ServerTTFT is the simulators' mean time to first token (vllm:time_to_first_token_seconds).
	ServerTTFT time.Duration
	// CachedRatio is Σ usage.prompt_tokens_details.cached_tokens / Σ usage.prompt_tokens over
	// the answers.
	CachedRatio float64
	// MeanTTFT is the clients' mean time to the first streamed token (every other request of a
	// session streams).
	MeanTTFT time.Duration
	// P50, P90: request latency (whole answer) as the clients saw it.
	P50, P90 time.Duration
	// Wall is the workload's duration.
	Wall time.Duration
}

// Progress is told how many requests of total are done.
type Progress func(done, total int)

// Run sends w through the stack's gateway and measures it.
func Run(ctx context.Context, s *Stack, w Workload, progress Progress) Result {
	sessions := w.sessions()
	total := w.Requests()
	index := map[string]int{}
	for i, sim := range s.Sims {
		index[sim.Addr] = i
	}
	st0 := s.Stats()
	hc := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 256}}
	defer hc.CloseIdleConnections()

	var (
		mu        sync.Mutex
		res       = Result{PerEndpoint: make([]int, len(s.Sims))}
		latencies []time.Duration
		ttftSum   time.Duration
		ttftN     int
		prompt    int
		cached    int
		done      atomic.Int64
	)
	record := func(a answer, err error) {
		mu.Lock()
		defer mu.Unlock()
		res.Requests++
		if err != nil {
			res.Errors++
			if res.FirstError == "" {
				res.FirstError = err.Error()
			}
			return
		}
		latencies = append(latencies, a.latency)
		if i, ok := index[a.servedBy]; ok {
			res.PerEndpoint[i]++
		}
		if a.ttft > 0 {
			ttftSum += a.ttft
			ttftN++
		}
		prompt += a.promptTokens
		cached += a.cachedTokens
	}

	start := time.Now()
	work := make(chan session)
	var wg sync.WaitGroup
	for i := 0; i < max(w.Concurrency, 1); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for sess := range work {
				prev := ""
				for k := 0; k < sess.steps; k++ {
					if ctx.Err() != nil {
						return
					}
					a, err := ask(ctx, hc, s.GatewayURL, sess.next(k, prev), k%2 == 1, w.MaxTokens)
					record(a, err)
					if progress != nil {
						progress(int(done.Add(1)), total)
					}
					if err != nil {
						break // the session's history is broken
					}
					prev = a.text
				}
			}
		}()
	}
	for _, sess := range sessions {
		select {
		case work <- sess:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	res.Wall = time.Since(start)

	st1 := s.Stats()
	if q := st1.CacheQueries - st0.CacheQueries; q > 0 {
		res.HitRate = float64(st1.CacheHits-st0.CacheHits) / float64(q)
	}
	res.Computed = (st1.PromptTokens - st0.PromptTokens) - (st1.CacheHits - st0.CacheHits)
	if n := st1.TTFTCount - st0.TTFTCount; n > 0 {
		res.ServerTTFT = time.Duration((st1.TTFTSum - st0.TTFTSum) / float64(n) * float64(time.Second))
	}
	if prompt > 0 {
		res.CachedRatio = float64(cached) / float64(prompt)
	}
	if ttftN > 0 {
		res.MeanTTFT = ttftSum / time.Duration(ttftN)
	}
	slices.Sort(latencies)
	if n := len(latencies); n > 0 {
		res.P50, res.P90 = latencies[n/2], latencies[n*9/10]
	}
	return res
}

type answer struct {
	servedBy                   string
	text                       string
	promptTokens, cachedTokens int
	latency, ttft              time.Duration
}

type usage struct {
	PromptTokens int `json:"prompt_tokens"`
	Details      struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// ask sends one chat request and reads the whole answer (streamed or not).
func ask(ctx context.Context, hc *http.Client, base string, msgs []message, stream bool, maxTokens int) (answer, error) {
	body, _ := json.Marshal(map[string]any{
		"model": engine.DefaultConfig().Model, "messages": msgs, "stream": stream, "max_tokens": maxTokens,
	})
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("content-type", "application/json")
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	a := answer{servedBy: resp.Header.Get("x-served-by")}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return a, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	var u *usage
	if stream {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok || data == "[DONE]" {
				continue
			}
			var ev struct {
				Choices []struct {
					Delta struct {
						Content string `json:"content"`
					} `json:"delta"`
				} `json:"choices"`
				Usage *usage `json:"usage"`
			}
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				return a, fmt.Errorf("bad SSE event: %v", err)
			}
			for _, c := range ev.Choices {
				if c.Delta.Content != "" && a.ttft == 0 {
					a.ttft = time.Since(start)
				}
				a.text += c.Delta.Content
			}
			if ev.Usage != nil {
				u = ev.Usage
			}
		}
		if err := sc.Err(); err != nil {
			return a, err
		}
	} else {
		var r struct {
			Choices []struct {
				Message message `json:"message"`
			} `json:"choices"`
			Usage *usage `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			return a, err
		}
		for _, c := range r.Choices {
			a.text += c.Message.Content
		}
		u = r.Usage
	}
	a.latency = time.Since(start)
	if u != nil {
		a.promptTokens, a.cachedTokens = u.PromptTokens, u.Details.CachedTokens
	}
	return a, nil
}
