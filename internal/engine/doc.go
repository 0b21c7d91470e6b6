// Package engine models one vLLM replica closely enough for routing: what a
// router can observe (queue lengths, KV usage, prefix-cache hits, time to
// first token, cached_tokens) behaves as it would on the real server. It
// has no HTTP in it: the simulator in internal/engine/httpserver serves it in
// real time, and a replay benchmark can run many engines in process on one
// VirtualClock, thousands of requests per wall-clock millisecond.
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
// Engine.Stats is what the server's /metrics reports; Result (given to
// Callbacks) is what its responses report; Engine.CachedPrefixTokens is an
// oracle for judging a router's prefix estimate.
//
// # Prompts
//
// ChatPrompt applies a Llama-3-like template and Tokenize a stand-in
// tokenizer (about 4 bytes a token, ids by hash, no vocabulary);
// ParseChatCompletion and ParseCompletion turn OpenAI bodies into an
// APIRequest.
//
// # Prefix cache
//
// KV memory is NumGPUBlocks blocks of BlockSize tokens. A full block's key
// chains the previous block's key with its token ids, so a hit on block i
// implies blocks 0..i. A request's hit is the longest run of leading
// cached blocks, at most (prompt-1)/BlockSize of them (vLLM recomputes the
// last prompt token). At admission a request pins its hit blocks and
// allocates blocks for its whole prompt plus output (so it is never
// preempted; vLLM allocates decode blocks as it goes), taking free blocks
// from the head of an LRU free queue and evicting what they cached. When it
// ends, the full blocks it computed (prompt and output) stay cached and its
// blocks return to the queue's tail in reverse order, so its tail blocks
// are evicted before its head blocks — vLLM's behaviour.
//
// # Time model
//
// A request waits in a FIFO queue until the batch has fewer than
// MaxNumSeqs running requests and its blocks fit (a head that does not fit
// blocks the queue). The GPU prefills one admitted request after another:
//
//	prefill       = PrefillOverhead + (prompt − cached) × PrefillPerToken
//	prefill_start = max(admitted, end of the previous prefill)
//	first_token   = prefill_start + prefill × slow
//	itl           = DecodePerToken × slow × (1 + DecodeBatchPenalty × (running−1)/(MaxNumSeqs−1))
//	end           = first_token + (output − 1) × itl
//	queue_wait    = prefill_start − arrival
//	TTFT          = queue_wait + prefill × slow
//
// slow is SlowFactor for requests drawn as slow, else 1; a slow request's
// extra time does not hold the GPU's prefill queue. running is the batch
// size when the first token is out; itl stays fixed from then on. The
// first token comes out of the prefill step, so decoding produces the
// remaining output − 1 tokens. Output length is MaxTokens when given,
// else OutputTokensMin + hash(prompt) mod (OutputTokensMax −
// OutputTokensMin + 1).
package engine
