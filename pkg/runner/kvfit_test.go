package runner_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvpick/kvpick/internal/routertest"
	"github.com/kvpick/kvpick/pkg/router"
)

// TestAPromptThatDoesNotFitItsHoldersFreeCacheGoesWhereItFits: with the default configuration,
// the endpoint that holds a long prompt's prefix keeps it while the prompt fits in the free
// part of that server's KV cache, and loses it once the server reports less free room than the
// prompt takes (there the request would wait for running requests to end before its prefill
// starts) — once less than half of it fits, although recomputing the prefix elsewhere costs
// ~250 blocks of prefill. (With kv-fit-scorer's weight 4 against the prefill estimate's 4 the
// holder keeps a prompt of which half or more fits; weight 8 moved that to ~3/4 and did not
// hold out on the replay: docs/benchmarks.md, "Busy small caches".)
func TestAPromptThatDoesNotFitItsHoldersFreeCacheGoesWhereItFits(t *testing.T) {
	// ~16,000 bytes: ~4,000 tokens at the assumed 4 bytes per token, 250 of the index's blocks.
	system := strings.Repeat("You are the assistant of a large company; answer within its policies. ", 230)
	// What the prompt takes on a server: its tokens plus kv-fit's 64 to start decoding. The chat
	// rendering adds a few dozen bytes, under 1% of this.
	need := float64(len(system))/4 + 64
	const capacityTokens = 4096 * 16 // newVLLMServer's vllm:cache_config_info

	tests := []struct {
		name     string
		fit      float64 // the holder's free room ÷ what the prompt needs
		wantHold bool
	}{
		{"room for it and half again: the holder keeps it", 1.5, true},
		{"less than half of it fits: it goes where it fits", 0.4, false},
		{"almost nothing free: it goes where it fits", 0.05, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			servers := []*vllmServer{newVLLMServer(t), newVLLMServer(t), newVLLMServer(t), newVLLMServer(t)}
			for _, s := range servers {
				s.set(0, 0.1)
			}
			pk := scrapedPicker(t, servers)

			route := func(question string) (*router.Endpoint, *router.Explanation) {
				req := routertest.Chat(t, system+question)
				req.Explain = &router.Explanation{}
				return serve(t, pk, req), req.Explain
			}
			holder, _ := route(" First question.")
			for i := range 3 {
				if got, _ := route(fmt.Sprintf(" Warm question %d.", i)); got != holder {
					t.Fatalf("warm-up request %d went to %s, not the prompt's holder %s", i, got.Addr, holder.Addr)
				}
			}

			usage := 1 - tc.fit*need/capacityTokens
			for _, s := range servers {
				if s.addr() == holder.Addr {
					s.set(0, usage)
				}
			}
			// Every server's scrape fresh (each reports the same 4 running requests), the
			// holder's sent after the last pick, so that no pick since it takes from the room.
			waitFor(t, "the servers' scrapes", func() bool {
				for _, e := range pk.Pool.Snapshot() {
					m := e.FreshMetrics(time.Now())
					if m == nil || e == holder && (m.KVUsage != usage || m.PicksAtScrape != holder.Picks()) {
						return false
					}
				}
				return true
			})
			got, why := route(" The question that matters.")
			if hold := got == holder; hold != tc.wantHold {
				var scores strings.Builder
				for _, c := range why.Candidates {
					fmt.Fprintf(&scores, "\n  %s holder=%v %v total %.3f", c.Endpoint.Addr, c.Endpoint == holder, c.Scores, c.Total)
				}
				t.Fatalf("with %.0f%% of what the prompt needs free on its holder (usage %.4f) it went to %s: held = %v, want %v; scores %v:%s",
					tc.fit*100, usage, got.Addr, hold, tc.wantHold, why.Scorers, scores.String())
			}
		})
	}
}
