// Package dataplane is an ext_proc client that behaves as Envoy's ext_proc filter documents: the
// stand-in data plane for the picker's tests, the development HTTP gateway and the replay
// benchmark (there is no Envoy binary here). It is also a protocol checker: every rule of
// docs/protocol.md that a server breaks surfaces as a *ProtocolError naming the Rule, so
// tests fail loudly.
//
// Use: c := New(conn); x, _ := c.Open(ctx, FullDuplex()); routed, err := x.Request(req); then the
// response side (ResponseHeaders, ResponseBody + NextResponseBody, ResponseTrailers, or the
// all-in-one Response); then x.Close(). Client.Do does all of it for one request.
//
// For load there is a fast path on the same messages: Prepare encodes a request once (the
// messages an Exchange would send, byte for byte), PrepareResponseHeaders and
// PrepareResponseChunk the response side, and a Duplex (Client.OpenDuplex) sends them on a
// FULL_DUPLEX_STREAMED stream and reads each answer into a summary without copying re-emitted
// bodies, checking the rules a summary can see (see Duplex). DialOptions are the connection
// options to carry load. cmd/loadgen drives the picker with it.
//
// # What the proxy does (docs/protocol.md line)
//
//   - One gRPC stream per HTTP request (10-12). protocol_config (both body modes and
//     send_body_without_waiting_for_header_response) rides on the first ProcessingRequest only,
//     unless Mode.OmitProtocolConfig (13-14).
//   - request_headers carries end_of_stream=true when there is no body (15-16). Header values go in
//     raw_value, or in value with HTTPRequest.HeaderValueField; pseudo headers :method, :path,
//     :authority, :scheme on requests and :status on responses (17-18).
//   - Header mutations are applied as Envoy does with default mutation rules: removals first, then
//     sets; append=false (the default) and OVERWRITE_IF_EXISTS_OR_ADD replace (22); changes to
//     host, :authority, :method, :scheme and x-envoy-* and removals of pseudo headers are ignored
//     and listed in Routed.Notes.
//   - A stream the server closes with OK means "continue without me": what it has not answered
//     goes on unmodified, nothing more is sent (23). Any other status fails the request with 500,
//     or 504 on a deadline: *StreamError (23-24).
//   - FULL_DUPLEX_STREAMED: headers, body chunks and trailers are sent without waiting; answers are
//     collected as they come (27-29). The proxy removes content-length (33-34). Trailer mode
//     must be SEND in this mode: Open refuses the Mode otherwise (34).
//   - BUFFERED: the whole body in one message after the headers answer; header mutations in the
//     body answer apply (39-43). BUFFERED_PARTIAL: the same, cut at WithBufferLimit (48).
//   - STREAMED: one message per chunk (WithChunkSize, default 16 KiB); chunks wait for the headers
//     answer unless send_body_without_waiting_for_header_response (44-46). Header mutations in
//     body answers are not applied; they are kept in Routed.IgnoredHeaderMutations (47).
//   - Outside FULL_DUPLEX_STREAMED trailers are sent once every body message is answered.
//   - Response bodies: NextResponseBody hands each chunk downstream as soon as it is answered,
//     never buffering the stream (52-53).
//   - Close half-closes the stream and expects the server to end it with OK (54).
//   - The subset hint is sent as filter metadata envoy.lb.subset_hint /
//     x-gateway-destination-endpoint-subset, a list or one comma-separated string (63-64); the
//     served endpoint as envoy.lb / x-gateway-destination-endpoint-served on response messages
//     (68-69).
//
// # The rules enforced (Rule, docs/protocol.md line)
//
//   - RuleHeaderValueOnly (19-21): a HeaderValue with only value set (Envoy would set "").
//   - RuleHeaderBothValues (21-22): a HeaderValue with both value and raw_value (Envoy fails 500).
//   - RuleHeaderInvalid (19-22): an invalid header name or value, or an unknown append_action.
//   - RuleOrder (28-29, 35-36, 44-47): answers out of the order headers, body, trailers; in
//     FULL_DUPLEX_STREAMED a trailers answer before the body was re-emitted.
//   - RuleDuplexStreamed (30-31): a FULL_DUPLEX_STREAMED body answer that is not
//     body_mutation.streamed_response.
//   - RuleDuplexChunkSize (32): a streamed chunk over 62,000 bytes.
//   - RuleDuplexEndOfStream (33, 35-36): end_of_stream=true before the input ended, when the input
//     ended with trailers, or more than once; or the stream closed before it.
//   - RuleContentLength (33-34, 43): in FULL_DUPLEX_STREAMED content-length not set again, or not
//     equal to the forwarded body; in BUFFERED a changed body with a stale content-length; any
//     content-length the server is responsible for that does not match.
//   - RuleDuplexEmptyBodyAnswer (36-37): a FULL_DUPLEX_STREAMED body answer without a streamed
//     mutation (an empty CommonResponse).
//   - RuleModeOverride (37-38): mode_override in FULL_DUPLEX_STREAMED.
//   - RuleHeadersDeadlock (39-41, 44-46): the headers answer (or an answer the proxy waits on
//     before sending the body's end) does not come within the message timeout: a server that
//     waits for the body first deadlocks.
//   - RuleStreamedOutsideDuplex (30-31, 39-43): streamed_response outside FULL_DUPLEX_STREAMED.
//   - RuleOneAnswer (50-51): more than one answer to one message outside FULL_DUPLEX_STREAMED
//     (or a second headers or trailers answer in any mode).
//   - RuleAnswerKind (10-12, 50-51): an answer of the wrong kind (a body answer to headers, an
//     answer for a message never sent).
//   - RuleAfterImmediate (50-51): anything after an ImmediateResponse.
//   - RuleStreamEnd (23-24, 54): after the half-close, the server still owes answers or does not
//     end the stream.
//   - RuleDestination (58-62): header x-gateway-destination-endpoint and metadata
//     envoy.lb/x-gateway-destination-endpoint both present but different, the metadata not a
//     string, or the header with several values (an append instead of a replace).
//   - RuleTransferEncoding (75): the server sets transfer-encoding.
//   - RuleMessageTimeout (37, 50-51): an owed answer does not come within WithMessageTimeout.
//     Envoy has no timer in FULL_DUPLEX_STREAMED (37); this client arms it once a direction's whole
//     input has been sent, so that a stuck server fails a test instead of hanging it.
//   - RuleUnsupported (38): CONTINUE_AND_REPLACE and streamed_immediate_response (not emulated).
//
// An Exchange costs one goroutine (its receiver) besides gRPC's own; Cancel, Close, a failure or
// the end of the Open context stop it.
package dataplane
