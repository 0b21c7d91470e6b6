// Package devgateway is a development HTTP gateway: it plays the data plane (Envoy with the
// ext_proc filter and an ORIGINAL_DST cluster) in front of the picker, so that the picker, a
// simulator pool and a client can run on one machine without Envoy. It is a tool for
// development, tests and demos, not a production proxy.
//
// It follows docs/protocol.md through internal/dataplane, the Envoy-like ext_proc client, so that
// what works here works behind Envoy:
//
//   - Each HTTP request opens one ext_proc stream (FULL_DUPLEX_STREAMED by default; BUFFERED and
//     STREAMED for tests). The request body goes to the picker and the picker's re-emission is
//     what goes upstream, with the picker's header mutations applied.
//   - The destination is x-gateway-destination-endpoint (or the envoy.lb metadata). A comma list
//     is the pick followed by retry fallbacks: the next one is tried when a connection cannot be
//     made (Envoy's retry_on connect-failure) and, by default, when the connection is reset
//     before any response header arrives (retry_on reset). Nothing is retried once the
//     response has started.
//   - The response goes back through the same stream: response headers with the endpoint that
//     served the request (metadata envoy.lb / x-gateway-destination-endpoint-served), then the
//     body chunk by chunk, each written and flushed to the client as soon as the picker
//     answers it (SSE keeps its time to first token), then trailers.
//   - When no destination can be reached, the gateway makes a local reply (503, OpenAI-style
//     JSON error) and, as Envoy does with local replies, passes it through the ext_proc
//     response path too: :status 503 and no served endpoint, so the picker sees the failure.
//   - An ext_proc stream that fails (the picker is down, or breaks the protocol) fails the
//     request with StatusOnError (Envoy's status_on_error), or 504 on a deadline.
//   - A client that goes away cancels the ext_proc stream and the upstream request.
//
// Policies round-robin and random bypass ext_proc entirely and spread requests over a static
// endpoint list: the baseline the demo compares the picker with.
package devgateway
