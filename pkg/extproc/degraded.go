package extproc

import (
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"go.uber.org/zap"
)

// Some processing modes let requests through but break what the picker learns from responses.
// They are the proxy's configuration, so the picker cannot fix them: it says so, once per
// reason in the log and per stream in kvpick_extproc_degraded_mode_streams_total.
const (
	// The proxy does not send the response body (response_body_mode NONE): the stream ends at
	// the response headers, so the request stops counting in flight (and in the prefill queue
	// as a first byte never comes) while it is being generated, and usage reports are lost.
	reasonResponseBodyNone = "response_body_none"
	// The proxy does not send the response headers (response_header_mode SKIP): the picker
	// never learns the response's status, so nothing is committed to the prefix index, and the
	// stream ends when the request has been sent.
	reasonResponseHeadersSkipped = "response_headers_skipped"
)

var degradedReasons = [...]string{reasonResponseBodyNone, reasonResponseHeadersSkipped}

// degradedReason tells, at the end of a routed stream, whether the proxy's processing mode kept
// the response from the picker. Only a stream the proxy closed (a half-close) counts: a
// cancelled stream ends early for reasons of its own.
func (st *stream) degradedReason() (int, bool) {
	switch {
	case !st.halfClosed:
		return 0, false
	case st.respMode == filterv3.ProcessingMode_NONE && !st.respHeadersEnd:
		return 0, true
	case !st.respHeadersSeen:
		return 1, true
	case !st.respHeadersEnd && !st.respRestSeen:
		// A response with a body whose body never came: the proxy does not send it (a proxy
		// without protocol_config, or one that says one mode and does another).
		return 0, true
	}
	return 0, false
}

// reportDegraded counts the stream and warns once per reason.
func (st *stream) reportDegraded() {
	i, ok := st.degradedReason()
	if !ok {
		return
	}
	reason := degradedReasons[i]
	if m := st.s.opt.Metrics; m != nil {
		m.degraded.WithLabelValues(reason).Inc()
	}
	st.s.warned[i].Do(func() {
		st.log.Warn("the proxy's processing mode breaks the picker's accounting: requests are routed, but worse "+
			"(set response_header_mode SEND and response_body_mode FULL_DUPLEX_STREAMED; see the README's Envoy section)",
			st.id(), zap.String("reason", reason), zap.String("response_body_mode", st.respMode.String()))
	})
}
