package router

// Explanation is why the pipeline picked what it picked for one request: every candidate that
// passed the filters, each scorer's score for it and the weighted total the picker chose by.
// Schedule fills it in when the request carries one (Request.Explain); without one, explaining
// costs a nil check per stage. Reusing an Explanation across requests reuses its storage.
type Explanation struct {
	// Scorers and Weights are the scorers' names and weights, in pipeline order.
	Scorers []string
	Weights []float64
	// Candidates are the endpoints that passed the filters, in the order the scorers saw them;
	// empty when none did.
	Candidates []Candidate
	// Picked is the chosen candidate's index in Candidates, -1 when none was chosen.
	Picked int

	scores []float64 // backing store of every candidate's Scores
}

// Candidate is one endpoint's scores in an Explanation.
type Candidate struct {
	Endpoint *Endpoint
	// Scores are the scorers' scores, clamped to [0,1] as the pipeline sums them, in the order
	// of Explanation.Scorers.
	Scores []float64
	// Total is the weighted sum of Scores.
	Total float64
}

func (x *Explanation) reset() {
	x.Candidates, x.Picked = x.Candidates[:0], -1
}

// begin records the candidates that passed the filters and the scorers about to rate them.
func (x *Explanation) begin(scorers []WeightedScorer, eps []*Endpoint) {
	x.Scorers, x.Weights = x.Scorers[:0], x.Weights[:0]
	for _, ws := range scorers {
		x.Scorers = append(x.Scorers, ws.Scorer.Name())
		x.Weights = append(x.Weights, ws.Weight)
	}
	k := len(scorers)
	if n := len(eps) * k; cap(x.scores) < n {
		x.scores = make([]float64, n)
	} else {
		x.scores = x.scores[:n]
	}
	x.Candidates = x.Candidates[:0]
	for i, e := range eps {
		x.Candidates = append(x.Candidates, Candidate{Endpoint: e, Scores: x.scores[i*k : (i+1)*k : (i+1)*k]})
	}
}

// record keeps scorer j's clamped scores.
func (x *Explanation) record(j int, scores []float64) {
	for i, v := range scores {
		x.Candidates[i].Scores[j] = clamp01(v)
	}
}

// end keeps the totals and the pick.
func (x *Explanation) end(totals []float64, picked int) {
	for i := range x.Candidates {
		x.Candidates[i].Total = totals[i]
	}
	if picked >= len(x.Candidates) {
		picked = -1
	}
	x.Picked = picked
}
