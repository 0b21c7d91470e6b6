package httpserver

import (
	"io"
	"net/http"

	"github.com/kvpick/kvpick/internal/engine"
	"github.com/kvpick/kvpick/internal/engine/servermetrics"
)

func (s *Server) metrics(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_ = servermetrics.Write(w, s.eng, s.opts.Metrics)
}

// WriteMetrics writes eng's /metrics page with vLLM's current names, as a
// Server with default options serves it, so in-process replays and tests
// can feed a router's scraper without HTTP. servermetrics.Write takes the
// other flavors.
func WriteMetrics(w io.Writer, eng *engine.Engine) error {
	return servermetrics.Write(w, eng, servermetrics.Options{})
}
