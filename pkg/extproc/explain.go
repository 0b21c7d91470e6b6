package extproc

import (
	"strconv"
	"strings"

	"go.uber.org/zap/zapcore"

	"github.com/kvpick/kvpick/pkg/router"
)

// ExplainHeader is the header a client sends (value 1 or true) to ask why its request went where
// it did, and the response header that answers, when the picker enables it
// (extProc.explainHeader): the chosen endpoint's weighted scores, how much of the prompt it
// likely holds, and how many endpoints were candidates. For example:
//
//	x-kvpick-explain: endpoint=10.0.0.7:8000; total=5.482; prefix-scorer=0.812*1; prefill-scorer=0.930*4; cache-room-scorer=0.500*2; inflight-scorer=0.950*1; match=24/30; candidates=4
const ExplainHeader = "x-kvpick-explain"

func explainAsked(v string) bool {
	v = strings.TrimSpace(v)
	return v == "1" || strings.EqualFold(v, "true")
}

func (s *Server) getExplanation() *router.Explanation {
	if x, ok := s.explains.Get().(*router.Explanation); ok {
		return x
	}
	return &router.Explanation{}
}

func (s *Server) putExplanation(x *router.Explanation) {
	clear(x.Candidates) // drop the endpoints: one may leave the pool
	x.Candidates = x.Candidates[:0]
	s.explains.Put(x)
}

// explainText is the explanation header's value for the chosen candidate.
func (st *stream) explainText(x *router.Explanation) string {
	if x.Picked < 0 {
		return ""
	}
	c := x.Candidates[x.Picked]
	b := make([]byte, 0, 256)
	b = append(b, "endpoint="...)
	b = append(b, c.Endpoint.Addr...)
	b = append(b, "; total="...)
	b = strconv.AppendFloat(b, c.Total, 'f', 3, 64)
	for j, name := range x.Scorers {
		b = append(b, "; "...)
		b = append(b, name...)
		b = append(b, '=')
		b = strconv.AppendFloat(b, c.Scores[j], 'f', 3, 64)
		b = append(b, '*')
		b = strconv.AppendFloat(b, x.Weights[j], 'g', -1, 64)
	}
	if f := st.s.opt.MatchBlocks; f != nil {
		m, total := f(&st.req, c.Endpoint)
		b = append(b, "; match="...)
		b = strconv.AppendInt(b, int64(m), 10)
		b = append(b, '/')
		b = strconv.AppendInt(b, int64(total), 10)
	}
	b = append(b, "; candidates="...)
	b = strconv.AppendInt(b, int64(len(x.Candidates)), 10)
	return string(b)
}

// candidates writes an explanation into a log line: per candidate its address, how much of the
// prompt it likely holds, each scorer's score, the weighted total and whether it was picked.
type candidates struct {
	st *stream
	x  *router.Explanation
}

func (c candidates) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	for i := range c.x.Candidates {
		if err := enc.AppendObject(candidate{c, i}); err != nil {
			return err
		}
	}
	return nil
}

type candidate struct {
	candidates
	i int
}

func (c candidate) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	cand := c.x.Candidates[c.i]
	enc.AddString("endpoint", cand.Endpoint.Addr)
	if f := c.st.s.opt.MatchBlocks; f != nil {
		m, total := f(&c.st.req, cand.Endpoint)
		enc.AddInt("match_blocks", m)
		enc.AddInt("prompt_blocks", total)
	}
	if err := enc.AddObject("scores", scores(c)); err != nil {
		return err
	}
	enc.AddFloat64("total", cand.Total)
	enc.AddBool("picked", c.i == c.x.Picked)
	return nil
}

type scores candidate

func (s scores) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	for j, name := range s.x.Scorers {
		enc.AddFloat64(name, s.x.Candidates[s.i].Scores[j])
	}
	return nil
}
