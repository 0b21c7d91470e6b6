package engine_test

import (
	"fmt"
	"time"

	"github.com/kvpick/kvpick/internal/engine"
)

// Example runs a small replay in virtual time: two engines on one clock,
// a least-loaded router, and a trace of chat requests that share a system
// prompt. It takes milliseconds of wall time.
func Example() {
	clk := engine.NewVirtualClock(time.Unix(0, 0))
	cfg := engine.DefaultConfig()
	engines := make([]*engine.Engine, 2)
	for i := range engines {
		engines[i], _ = engine.New(cfg, clk)
	}
	var done, cached int
	var ttft time.Duration
	record := engine.Callbacks{Done: func(r engine.Result) {
		done++
		cached += r.CachedTokens
		ttft += r.TTFT()
	}}
	for i := range 100 {
		clk.AdvanceTo(time.Unix(0, 0).Add(time.Duration(i) * 10 * time.Millisecond))
		body := fmt.Sprintf(`{"model":%q,"max_tokens":20,"messages":[
			{"role":"system","content":"You are a support agent for a company that sells routers. Answer politely and cite the manual."},
			{"role":"user","content":"Question number %d: how do I reset it?"}]}`, cfg.Model, i)
		req, err := engine.ParseChatCompletion([]byte(body))
		if err != nil {
			panic(err)
		}
		best := engines[0]
		for _, e := range engines[1:] {
			if e.Load().Running < best.Load().Running {
				best = e
			}
		}
		if _, err := best.Submit(req.EngineRequest(""), record); err != nil {
			panic(err)
		}
	}
	clk.RunUntilIdle()
	fmt.Printf("%d done, %d cached tokens, mean TTFT %v\n", done, cached, ttft/time.Duration(done))
	// Output: 100 done, 4704 cached tokens, mean TTFT 4.994354ms
}
