// Package engine models one vLLM (V1 engine) replica closely enough for
// routing: what a router can observe (queue lengths, KV usage, prefix-cache
// hits, time to first token, the pace of a stream, cached_tokens) behaves
// as it does on the real server. It has no HTTP in it: the simulator in
// internal/engine/httpserver serves it in real time, and a replay benchmark
// runs many engines in process on one VirtualClock, thousands of requests
// per wall-clock second. The facts it follows are in the project's
// model-servers notes (vLLM's scheduler, prefix cache and metrics).
//
// # Driving engines in virtual time
//
//	clk := engine.NewVirtualClock(time.Unix(0, 0))
//	eng, _ := engine.New(engine.DefaultConfig(), clk)
//	for _, rq := range trace { // sorted by arrival
//		clk.AdvanceTo(rq.At)   // runs every engine event due before it
//		_, err := eng.Submit(rq.Req, engine.Callbacks{Done: record})
//		...
//	}
//	clk.RunUntilIdle()
//
// Engine.Stats is what the server's /metrics reports (package
// servermetrics renders it); Result (given to Callbacks) is what its
// responses report; Engine.Load, Engine.CachedPrefixTokens and
// Engine.RunningRemaining are oracles for routers in a replay.
//
// # Prompts
//
// ChatPrompt applies a Llama-3-like template and Tokenize a stand-in
// tokenizer (about 4 bytes a token, ids by hash, no vocabulary);
// ParseChatCompletion and ParseCompletion turn OpenAI bodies into an
// APIRequest.
//
// # Scheduler (vLLM V1's Scheduler.schedule, chunked prefill on)
//
// The engine runs steps back to back while it has work, one clock timer
// per step; a step starts at the previous one's end even when its timer
// fires late (a real clock on a busy host), and admits only requests that
// had arrived by then. Each step has a budget of MaxNumBatchedTokens
// tokens, spent in vLLM's order:
//
//  1. Running requests, in the order they were admitted: one that is
//     decoding takes 1 token; one whose prompt is not yet computed (a long
//     prompt, or a request resuming after preemption) takes min(tokens it
//     has left, budget left) — a chunk.
//  2. Then, unless a request was preempted in this step, waiting requests in
//     FIFO order, while budget is left, fewer than MaxNumSeqs run and the
//     head's blocks fit (a head that does not fit blocks the queue, as in
//     vLLM): the request takes its prefix hit and min(uncached tokens,
//     budget left).
//
// A request is waiting (Stats.Waiting, vllm:num_requests_waiting) until a
// step schedules its first tokens; from then on it is running, prefilling
// or decoding (vllm:num_requests_running). Submit never runs a step: an
// idle engine starts one from a clock event at the same instant, so
// requests submitted together share it, and a server that answers a
// stream's headers right after Submit sends them before the request's first
// step.
//
// # Time model
//
// A step that schedules p prompt tokens (chunks, recomputation) beside d
// decoding requests lasts
//
//	step = StepOverhead + p × PrefillPerToken + decode(d)
//	decode(d) = DecodePerToken × (1 + DecodeBatchPenalty × (d−1)/(MaxNumSeqs−1)), 0 when d = 0
//
// so a long prefill in a step slows every decode beside it, and a long
// prompt spreads over several steps. A request whose tokens are all
// computed at the end of a step samples a token then: its first token comes
// at the end of the step that completes its prompt, each later one at the
// end of the next step that includes it. TTFT = waiting + the steps of its
// prefill; the gap between tokens is the length of the steps, which the
// batch and the prefills beside it set. Output length is MaxTokens when
// given, else OutputTokensMin + hash(prompt) mod (OutputTokensMax −
// OutputTokensMin + 1).
//
// Simplifications: attention's cost does not grow with context length (a
// token of a long prompt costs as much as one of a short prompt; decode
// cost depends on the number of sequences only); the step cost is additive
// where a GPU would overlap memory-bound decode with compute-bound prefill;
// there is no speculative decoding, no async scheduling (vLLM can plan the
// next step while the GPU runs this one), no priority scheduling, and
// n = 1, no beam search.
//
// # KV cache and prefix caching
//
// KV memory is NumGPUBlocks blocks of BlockSize tokens, as vLLM's
// BlockPool. A full block's key chains the previous block's key with its
// token ids (and the cache salt at the root), so a hit on block i implies
// blocks 0..i. When a request is first scheduled its hit is the longest run
// of leading cached blocks, at most (tokens−1)/BlockSize of them (vLLM
// always computes the last token); it is counted in the prefix-cache
// queries and hits and reported as CachedTokens. Blocks are allocated as
// tokens are scheduled — a prompt chunk's blocks, then one block every
// BlockSize decode tokens — and taken from the head of the free queue,
// evicting what they cached. A block is registered in the cache when the
// step that computes its last token is scheduled, so a request scheduled
// after it, even in the same step, hits it (vLLM caches blocks at
// allocation too). When a request ends its blocks return to the free queue
// tail first, in reverse order, so its tail is evicted before its head; the
// full blocks it computed (prompt and output, all but the last output
// token) stay cached until evicted. KVUsage is the fraction of blocks that
// running requests reference; cached but free blocks count as free.
//
// # Preemption
//
// When a running request cannot get a block for its tokens, the most
// recently admitted running request is preempted (vLLM's recompute mode):
// its blocks are freed (and stay cached until evicted), it goes back to the
// front of the waiting queue, and when it is scheduled again it takes the
// prefix hit of its prompt and output so far and recomputes the rest before
// producing its next token. If the request needing blocks is itself the
// most recent, it is the one preempted, and no more running requests are
// scheduled in that step; no waiting request is admitted in a step that
// preempted.
//
// # Failure injection
//
// ErrorRate: Submit refuses the request (ErrInjected; HTTP 500 before any
// output). LateErrorRate: the request fails after half its output
// (OutcomeError; a stream gets an error event). HangRate: the request is
// admitted — it takes a batch slot and its prompt's blocks — and never gets
// a token until cancelled. SlowRate: once admitted the request gets tokens
// in only one step in SlowFactor (it still counts in the batch when
// skipped), so its prefill chunks after the first and its decode are
// SlowFactor times slower without making the steps longer for others. The
// draws depend only on Seed and the order of submissions.
//
// # Concurrency and determinism
//
// An Engine is safe for concurrent use. Callbacks run without engine locks
// held, in order, on the goroutine delivering the engine's events (the
// clock's, or the caller of Handle.Cancel); they may call back into the
// engine. On a VirtualClock the same submissions at the same times give the
// same results to the nanosecond.
package engine
