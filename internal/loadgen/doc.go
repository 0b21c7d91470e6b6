// Package loadgen is an ext_proc load generator for the kvpick picker. It talks to the picker
// the way Envoy does in FULL_DUPLEX_STREAMED mode (one Process stream per HTTP request: request
// headers with protocol_config, body chunks, then response headers, the response body chunk by
// chunk and a half-close) through internal/dataplane's fast path: messages built as the
// Envoy-like client builds them and encoded once, answers read into a summary. Each exchange is
// checked just enough to count errors: a destination header, the body re-emitted with its full
// length, the response passed through whole, the stream ended with OK.
//
// Three scenarios are built on it (cmd/loadgen runs them; docs/loadgen.md explains them):
// Throughput (back-to-back exchanges, warm prefix index), Streams (many concurrently open
// streams, then their responses streamed token by token, as LLM requests do) and Churn (unique
// prompts against a small index, checking that the live heap stays bounded). Around them: a
// log-linear latency histogram, picker samples from its /metrics page (internal/promtext),
// /proc/<pid>/stat parsing, and the management of a picker process built from cmd/extproc.
package loadgen
