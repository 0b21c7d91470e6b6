// Package kvfit scores endpoints by whether what a request adds to their KV cache fits in its
// free part now.
//
// A model server starts a waiting request's prefill only when its KV cache has free blocks for
// it: vLLM V1 allocates a request's blocks as it schedules the prefill (blocks that hold cached
// prefixes but no running request count as free, and are evicted on demand), and preempts
// running requests when their decodes run out of blocks. The servers report the share of the
// cache that running requests hold (vllm:kv_cache_usage_perc, sglang:token_usage) and the
// cache's size (vllm:cache_config_info, sglang:max_total_num_tokens). On small caches one long
// prompt takes much of a cache (an agent's 10,000-token context on a 12,000-token cache): sent
// where the free room is smaller than what it adds, the request waits for running requests to
// finish, which neither the prefill-queue estimate nor the in-flight count shows.
//
//	score = min(1, free / need)
//	free  = (1 - usage) × capacity − (picks since the scrape) × need
//	need  = (prompt blocks − blocks requests running there share) × tokens per block + decodeTokens
//
// Only the blocks that requests running on the endpoint reference are left out of need: a prefix
// that running requests share (a system prompt) is in the reported usage once and costs the next
// request nothing, while a cached prefix that no running request references (a chat's history
// between its turns) sits among the free blocks and takes them again when reused — vLLM counts
// such blocks as free and evicts them on demand. On the tuning seeds (small caches) this
// running-only count made multi-turn TTFT p90 5% lower (3 seeds better, none worse) and agent
// 3% (2 better, 1 worse) than leaving out every block the endpoint holds, shared system prompts
// unchanged; counting the whole prompt instead pushed requests away from the servers that hold
// their system prompt (shared-prefix p90 1.37×; docs/benchmarks.md "KV room").
// The picks made since the endpoint's last scrape are not in its reported usage; each is
// assumed to need as much as this request (requests that arrive together tend to be alike).
// A server that reports its usage but not its cache's size is sized by the evidence: the size
// the prefix scorer learned from its cached_tokens reports, and at least what its usage shows
// the picker's running requests to take (learnCapacity; prefix.Matches.LearnedCacheTokens). On
// the replay's small caches with no size reported (capacity-x10 and capacity-x0.1) that cut
// agent TTFT p90 by 14-16% and p99 by 25-38%, multi-turn p99 by 27-30% on the tuning seeds
// (held-out: agent p90 -18 to -21%, 19 of 24 seeds better), at a cost of 1.7 points of hit
// ratio for shared system prompts at 0.1×: learned sizes are right for the pool, not for each
// server (docs/benchmarks.md "KV room").
// An endpoint scores 1, no evidence of a shortage, when its metrics are stale or missing or
// report no KV usage, or no cache size while none has been learned: usage alone does not say
// whether this request fits (1 - usage in its place, the GIE endpoint picker's KV-utilisation
// score, made multi-turn chat p90 1.24× on servers that report no size, tuning seeds).
package kvfit

import (
	"context"
	"math"

	"github.com/kvpick/kvpick/pkg/prefix"
	"github.com/kvpick/kvpick/pkg/router"
)

// Name is the plugin's name in config files.
const Name = "kv-fit-scorer"

// decodeTokens is the room a request needs beyond its prompt to start decoding: vLLM allocates
// decode blocks as tokens come, so this is 4 blocks of 16 tokens, not the whole answer.
const decodeTokens = 64

// Scorer is the KV-fit scorer. It has no state of its own; the prefix scorer, listed before
// it, supplies the prompt's length, the blocks the requests running on each endpoint share
// with it and the tokens per block.
type Scorer struct{}

var _ router.Scorer = (*Scorer)(nil)

// Name implements router.Plugin.
func (*Scorer) Name() string { return Name }

// Score implements router.Scorer.
func (*Scorer) Score(_ context.Context, req *router.Request, eps []*router.Endpoint, scores []float64) {
	m := prefix.MatchesOf(req)
	for i, e := range eps {
		scores[i] = 1
		mt := e.FreshMetrics(req.Now)
		if mt == nil || !mt.HasKVUsage {
			continue
		}
		c := float64(mt.CapacityTokens())
		if c <= 0 {
			c = m.LearnedCacheTokens(e)
		}
		if c <= 0 || math.IsNaN(mt.KVUsage) {
			continue
		}
		room := (1 - min(max(mt.KVUsage, 0), 1)) * c
		picks := float64(max(0, e.Picks()-mt.PicksAtScrape))
		// The score falls as need grows: when the whole prompt fits, so does any part of it,
		// and the running requests' prefixes need not be looked up (the common case).
		need := float64(m.Total)*m.TokensPerBlock + decodeTokens
		if room-picks*need >= need {
			continue
		}
		need = float64(m.Total-m.RunningBlocks(e))*m.TokensPerBlock + decodeTokens
		scores[i] = min(1, max(0, room-picks*need)/need)
	}
}
