package httpserver

import (
	"io"
	"net/http"

	"github.com/kvpick/kvpick/internal/engine"
	"github.com/kvpick/kvpick/internal/engine/servermetrics"
)

// metrics serves GET /metrics and every path under it, as vLLM's routes do (SGLang's too):
// the query name[]=... is answered as the exposition says (by default the flavor's: vLLM
// sends its whole page on /metrics and only the named series on /metrics/).
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	o := s.opts.Metrics
	e := o.Exposition
	if e == "" {
		e = servermetrics.DefaultExposition(o.Flavor)
	}
	e.WriteAnswer(w, r, servermetrics.Render(s.eng.Config(), s.eng.Stats(), s.eng.Clock().Now(), o))
}

// WriteMetrics writes eng's /metrics page with vLLM's current names, as a
// Server with default options serves it, so in-process replays and tests
// can feed a router's scraper without HTTP. servermetrics.Write takes the
// other flavors.
func WriteMetrics(w io.Writer, eng *engine.Engine) error {
	return servermetrics.Write(w, eng, servermetrics.Options{})
}
