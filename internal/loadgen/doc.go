// Package loadgen is a lean ext_proc load generator for the kvpick picker. It talks to the
// picker the way Envoy does in FULL_DUPLEX_STREAMED mode (one Process stream per HTTP request:
// request headers with protocol_config, body chunks, then response headers, one response chunk
// and a half-close) on the generated gRPC stub, with messages encoded once before the run, a
// codec that decodes only what the checks need, and a non-zeroing buffer pool; it validates
// each answer just enough to count errors: a destination header, the body re-emitted with its
// full length, the response echoed, the stream ended with OK.
//
// Three scenarios are built on it (cmd/loadgen runs them; docs/loadgen.md explains them):
// Throughput (back-to-back exchanges, warm prefix index), Streams (many concurrently open
// streams, as LLM requests hold them while generating) and Churn (unique prompts against a small
// index, sampling memory over time). Around them: a log-linear latency histogram, a Prometheus
// text-format scraper with histogram quantiles, /proc/<pid>/stat parsing, and the management of
// a picker process built from cmd/extproc.
package loadgen
