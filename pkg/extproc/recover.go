package extproc

import (
	"fmt"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A panic in a plugin (or here) must fail one request, not the process and every stream open
// on it. Process recovers what handling a message throws; the plugin calls of the stream's end
// recover their own, so that the request still leaves the in-flight count.

// recovered turns a panic while handling the stream into the stream's end: an OpenAI-style 500
// when the request has not been answered yet, else an Internal status, which makes the proxy
// fail the request (unless it is configured to fail open). The deferred finish then takes the
// request out of the accounting.
func (st *stream) recovered(r any) error {
	st.logPanic("stream", r)
	if st.phase != phaseRouted && st.outcome != "rejected" {
		if st.srv.Send(st.reject(500, "internal_error", "internal_error", "",
			"the endpoint picker failed on this request")) == nil {
			return nil
		}
	}
	if st.outcome == "" || st.outcome == "success" {
		st.outcome = "cancelled"
	}
	return status.Error(codes.Internal, "kvpick: internal error while processing the request")
}

// deliverUsage hands the usage report to the pipeline, once, at the stream's end; a panic is
// logged and counted.
func (st *stream) deliverUsage() {
	defer st.recoverPlugin("usage")
	st.reportUsage()
}

// done ends the request in the pipeline. The pipeline leaves the in-flight count before it
// calls the plugins, so a panicking plugin cannot keep the request counted.
func (st *stream) done() {
	defer st.recoverPlugin("done")
	st.s.pipe.Done(&st.req, st.decision.Endpoint)
}

// recoverPlugin, deferred, recovers a panic of the stage named.
func (st *stream) recoverPlugin(stage string) {
	if r := recover(); r != nil {
		st.logPanic(stage, r)
	}
}

func (st *stream) logPanic(stage string, r any) {
	if m := st.s.opt.Metrics; m != nil {
		m.panics.Inc()
	}
	st.log.Error("panic while processing a request: the request fails, the picker goes on",
		st.id(), zap.String("stage", stage), zap.String("panic", fmt.Sprint(r)), zap.Stack("stack"))
}
