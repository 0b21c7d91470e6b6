package prefix

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/openai"
	"github.com/kvpick/kvpick/pkg/router"
)

func testPlugin(t *testing.T) *Plugin {
	t.Helper()
	pl, err := New(Params{BlockSize: 64, MaxBlocksPerRequest: 1000, LRUCapacityPerEndpoint: 10000,
		MinMatchBlocks: 2, PendingTTL: config.Duration(time.Minute), CalibrateCapacity: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return pl
}

// chatRequest builds a parsed chat request whose conversation has the given user turns.
func chatRequest(t *testing.T, system string, turns ...string) *router.Request {
	t.Helper()
	var msgs []string
	msgs = append(msgs, fmt.Sprintf(`{"role":"system","content":%q}`, system))
	for i, u := range turns {
		msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":%q}`, u))
		if i < len(turns)-1 {
			msgs = append(msgs, fmt.Sprintf(`{"role":"assistant","content":"answer %d"}`, i))
		}
	}
	body := []byte(`{"model":"m","messages":[` + strings.Join(msgs, ",") + `]}`)
	var b openai.Request
	if err := openai.Parse(openai.APIChatCompletions, body, &b); err != nil {
		t.Fatal(err)
	}
	return &router.Request{API: openai.APIChatCompletions, Body: &b, Model: b.Model}
}

func scores(pl *Plugin, req *router.Request, eps []*router.Endpoint) []float64 {
	s := make([]float64, len(eps))
	pl.Score(context.Background(), req, eps, s)
	return s
}

// endpoints returns n endpoints 10.0.0.1:8000 … in slots 0 … n-1.
func endpoints(n int) []*router.Endpoint {
	eps := make([]*router.Endpoint, n)
	for i := range eps {
		eps[i] = router.NewEndpoint(fmt.Sprintf("10.0.0.%d:8000", i+1), i)
	}
	return eps
}

func twoEndpoints() []*router.Endpoint { return endpoints(2) }

var longSystem = strings.Repeat("You are a careful assistant that answers in full sentences. ", 20)

func TestCommitOnlyOnSuccessfulResponse(t *testing.T) {
	tests := []struct {
		status     int
		wantCommit bool
	}{
		{200, true}, {204, true}, {400, false}, {429, false}, {500, false}, {503, false},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.status), func(t *testing.T) {
			pl, eps := testPlugin(t), twoEndpoints()
			req := chatRequest(t, longSystem, "question one")
			pl.Prepare(context.Background(), req)
			pl.Picked(req, eps[0])
			pl.ResponseHeaders(req, eps[0], tc.status)
			pl.Done(req, eps[0])
			if pl.PendingCount() != 0 {
				t.Fatalf("%d pending records left after the stream ended", pl.PendingCount())
			}
			next := chatRequest(t, longSystem, "question one")
			pl.Prepare(context.Background(), next)
			s := scores(pl, next, eps)
			if committed := s[0] > 0; committed != tc.wantCommit {
				t.Fatalf("status %d: committed = %v (scores %v)", tc.status, committed, s)
			}
			if s[1] != 0 {
				t.Fatalf("the other endpoint scored %v", s[1])
			}
		})
	}
}

func TestPendingRecordAttractsFollowersUntilTheStreamEnds(t *testing.T) {
	pl, eps := testPlugin(t), twoEndpoints()
	first := chatRequest(t, longSystem, "burst")
	pl.Prepare(context.Background(), first)
	pl.Picked(first, eps[1])

	follower := chatRequest(t, longSystem, "burst")
	pl.Prepare(context.Background(), follower)
	if s := scores(pl, follower, eps); s[1] != 1 || s[0] != 0 {
		t.Fatalf("while the first request is pending, follower scores %v, want [0 1]", s)
	}
	// The first request's stream ends without a response (cancelled): the record goes.
	pl.Done(first, eps[1])
	if s := scores(pl, follower, eps); s[1] != 0 {
		t.Fatalf("after the stream ended, follower scores %v, want zeros", s)
	}
}

func TestPendingRecordExpires(t *testing.T) {
	pl, eps := testPlugin(t), twoEndpoints()
	now := time.Unix(5000, 0)
	pl.now = func() time.Time { return now }
	first := chatRequest(t, longSystem, "slow")
	pl.Prepare(context.Background(), first)
	pl.Picked(first, eps[0])
	follower := chatRequest(t, longSystem, "slow")
	pl.Prepare(context.Background(), follower)
	now = now.Add(2 * time.Minute)
	if s := scores(pl, follower, eps); s[0] != 0 {
		t.Fatalf("expired pending record still scores %v", s)
	}
}

func TestCommitGoesToTheServedEndpoint(t *testing.T) {
	pl, eps := testPlugin(t), twoEndpoints()
	req := chatRequest(t, longSystem, "fallback")
	pl.Prepare(context.Background(), req)
	pl.Picked(req, eps[0])
	pl.ResponseHeaders(req, eps[1], 200) // the proxy retried on the other endpoint
	pl.Done(req, eps[0])
	next := chatRequest(t, longSystem, "fallback")
	pl.Prepare(context.Background(), next)
	if s := scores(pl, next, eps); s[0] != 0 || s[1] != 1 {
		t.Fatalf("scores %v, want [0 1]", s)
	}
}

func TestLaterTurnsMatchEarlierTurns(t *testing.T) {
	pl, eps := testPlugin(t), twoEndpoints()
	turn1 := chatRequest(t, longSystem, "first question about the weather")
	pl.Prepare(context.Background(), turn1)
	pl.Picked(turn1, eps[0])
	pl.ResponseHeaders(turn1, eps[0], 200)
	pl.Done(turn1, eps[0])

	turn2 := chatRequest(t, longSystem, "first question about the weather", "and a follow-up")
	pl.Prepare(context.Background(), turn2)
	s := scores(pl, turn2, eps)
	st := pl.state(turn2)
	want := float64(len(pl.state(turn2).hashes)-1) / float64(len(st.hashes))
	if s[0] < want-0.05 || s[0] >= 1 {
		t.Fatalf("second turn scores %v on the first turn's endpoint, want about %v", s[0], want)
	}
}

func TestShortMatchesCountAsNone(t *testing.T) {
	pl, eps := testPlugin(t), twoEndpoints()
	// One 64-byte block of shared text, then different prompts.
	shared := strings.Repeat("z", 64)
	a := chatRequest(t, shared+strings.Repeat("a", 600))
	pl.Prepare(context.Background(), a)
	pl.Picked(a, eps[0])
	pl.ResponseHeaders(a, eps[0], 200)
	pl.Done(a, eps[0])
	b := chatRequest(t, shared+strings.Repeat("b", 600))
	pl.Prepare(context.Background(), b)
	if s := scores(pl, b, eps); s[0] != 0 {
		t.Fatalf("a one-block match scored %v (minMatchBlocks is 2)", s[0])
	}
}

func TestRemovedEndpointIsForgotten(t *testing.T) {
	pl, eps := testPlugin(t), twoEndpoints()
	req := chatRequest(t, longSystem, "gone")
	pl.Prepare(context.Background(), req)
	pl.Picked(req, eps[0])
	pl.ResponseHeaders(req, eps[0], 200)
	pl.Done(req, eps[0])
	eps[0].MarkRemoved()
	pl.EndpointsChanged(nil, eps[:1])
	if s := pl.Index().Stats(); s.Entries != 0 {
		t.Fatalf("index keeps %d entries of a removed endpoint", s.Entries)
	}
	// A late response for a removed endpoint commits nothing.
	late := chatRequest(t, longSystem, "late")
	pl.Prepare(context.Background(), late)
	pl.Picked(late, eps[0])
	pl.ResponseHeaders(late, eps[0], 200)
	pl.Done(late, eps[0])
	if s := pl.Index().Stats(); s.Entries != 0 {
		t.Fatalf("a removed endpoint received %d entries", s.Entries)
	}
}

func TestRequestsWithoutBodyAreNotScored(t *testing.T) {
	pl, eps := testPlugin(t), twoEndpoints()
	req := &router.Request{API: openai.APIOther}
	pl.Prepare(context.Background(), req)
	if s := scores(pl, req, eps); s[0] != 0 || s[1] != 0 {
		t.Fatalf("scores %v", s)
	}
	pl.Picked(req, eps[0])
	pl.ResponseHeaders(req, eps[0], 200)
	pl.Done(req, eps[0])
	if req.AffinityKey != 0 {
		t.Fatal("affinity key set without a prompt")
	}
}

func TestParamsValidateNamesTheField(t *testing.T) {
	good := Params{BlockSize: 64, MaxBlocksPerRequest: 10, LRUCapacityPerEndpoint: 10, MinMatchBlocks: 1}
	tests := []struct {
		field string
		edit  func(*Params)
	}{
		{"blockSize", func(p *Params) { p.BlockSize = 4 }},
		{"maxBlocksPerRequest", func(p *Params) { p.MaxBlocksPerRequest = 0 }},
		{"lruCapacityPerEndpoint", func(p *Params) { p.LRUCapacityPerEndpoint = 0 }},
		{"minMatchBlocks", func(p *Params) { p.MinMatchBlocks = -1 }},
		{"pendingTTL", func(p *Params) { p.PendingTTL = -1 }},
	}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		p := good
		tc.edit(&p)
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: err = %v", tc.field, err)
		}
	}
}

// TestUsageReportsRescaleCapacity: lruCapacityPerEndpoint counts blocks of 16 tokens; the
// plugin learns how many tokens its 64-byte blocks are from the servers' prompt_tokens and
// holds as many of its own blocks as cover the same tokens; the scorers after it read the same
// estimate (Matches.TokensPerBlock).
func TestUsageReportsRescaleCapacity(t *testing.T) {
	tests := []struct {
		name          string
		bytesPerToken float64
		reports       int
		want          int
		off           bool
	}{
		{"no reports: 4 bytes per token assumed", 5, 0, 10000, false},
		{"calibration off: the configured capacity stays", 5, 200, 10000, true},
		{"too few reports to act on", 5, calibMinSamples - 1, 10000, false},
		{"5 bytes per token: blocks hold fewer tokens, so more of them fit", 5, 200, 12500, false},
		{"3 bytes per token (code): fewer blocks fit", 3, 200, 7500, false},
		{"4 bytes per token: unchanged", 4, 200, 10000, false},
		{"absurd reports are clamped to 16 bytes per token", 64, 200, 40000, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pl := testPlugin(t)
			if tc.off {
				var err error
				if pl, err = New(Params{BlockSize: 64, MaxBlocksPerRequest: 1000, LRUCapacityPerEndpoint: 10000,
					MinMatchBlocks: 2, PendingTTL: config.Duration(time.Minute)}, nil); err != nil {
					t.Fatal(err)
				}
			}
			eps := twoEndpoints()
			for i := range tc.reports {
				req := chatRequest(t, longSystem, fmt.Sprintf("question %d", i))
				pl.Prepare(context.Background(), req)
				scores(pl, req, eps)
				pl.Picked(req, eps[0])
				pl.ResponseHeaders(req, eps[0], 200)
				st := pl.state(req)
				tokens := int(float64(st.rendered) / tc.bytesPerToken)
				pl.Usage(req, eps[0], openai.Usage{PromptTokens: tokens})
				pl.Done(req, eps[0])
			}
			pl.caps.settle()
			if got := pl.Index().Capacity(); got < tc.want*99/100 || got > tc.want*101/100 {
				t.Errorf("capacity %d, want %d (±1%%)", got, tc.want)
			}
			// The scorers after it read the same estimate: tokens per 64-byte block.
			req := chatRequest(t, longSystem, "one more")
			pl.Prepare(context.Background(), req)
			scores(pl, req, eps)
			wantTPB := 16 * 10000 / float64(tc.want)
			if got := MatchesOf(req).TokensPerBlock; got < wantTPB*0.99 || got > wantTPB*1.01 {
				t.Errorf("Matches.TokensPerBlock %v, want %v (±1%%)", got, wantTPB)
			}
			pl.Done(req, eps[0])
		})
	}
}

func TestUsageOfShortOrTruncatedPromptsIsIgnored(t *testing.T) {
	pl, err := New(Params{BlockSize: 64, MaxBlocksPerRequest: 8, LRUCapacityPerEndpoint: 10000,
		MinMatchBlocks: 2, PendingTTL: config.Duration(time.Minute), CalibrateCapacity: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	eps := twoEndpoints()
	for i := range 200 {
		short := chatRequest(t, "be brief", fmt.Sprintf("q%d", i)) // under four blocks
		long := chatRequest(t, longSystem, fmt.Sprintf("q%d", i))  // cut at 8 blocks
		for _, req := range []*router.Request{short, long} {
			pl.Prepare(context.Background(), req)
			scores(pl, req, eps)
			pl.Picked(req, eps[0])
			pl.ResponseHeaders(req, eps[0], 200)
			pl.Usage(req, eps[0], openai.Usage{PromptTokens: 5000}) // would mean ~0.3 bytes per token
			pl.Done(req, eps[0])
		}
	}
	pl.caps.settle()
	if got := pl.Index().Capacity(); got != 10000 {
		t.Errorf("capacity %d: reports of short or truncated prompts must not calibrate", got)
	}
}

func TestReuseRateFollowsTheTraffic(t *testing.T) {
	pl := testPlugin(t)
	eps := twoEndpoints()
	held := chatRequest(t, longSystem, "the same question")
	pl.Prepare(context.Background(), held)
	scores(pl, held, eps)
	pl.Picked(held, eps[0])
	pl.ResponseHeaders(held, eps[0], 200)
	pl.Done(held, eps[0])
	reuse := func(req *router.Request) float64 {
		pl.Prepare(context.Background(), req)
		scores(pl, req, eps)
		r := MatchesOf(req).Reuse
		pl.Done(req, eps[0])
		return r
	}
	var r float64
	for range 1500 {
		r = reuse(chatRequest(t, longSystem, "the same question"))
	}
	if r < 0.95 {
		t.Errorf("reuse %.3f after 1,500 requests for a cached prompt, want ~1", r)
	}
	for i := range 1500 {
		r = reuse(chatRequest(t, fmt.Sprintf("system prompt number %d, unlike any other. %s", i, longSystem), "q"))
	}
	if r > 0.05 {
		t.Errorf("reuse %.3f after 1,500 requests that share nothing, want ~0", r)
	}
}

// TestAStreamCommitsAtItsFirstByte: a stream's headers come when the request reaches the server,
// before its prefill, so until its first byte a follower must see a prefill in progress (a
// pending match), not a cached prefix; a non-streamed response commits at its headers.
func TestAStreamCommitsAtItsFirstByte(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			pl := testPlugin(t)
			eps := twoEndpoints()
			req := chatRequest(t, longSystem, "first")
			req.Body.Stream = stream
			pl.Prepare(context.Background(), req)
			scores(pl, req, eps)
			pl.Picked(req, eps[0])
			pl.ResponseHeaders(req, eps[0], 200)
			follower := func() Matches {
				f := chatRequest(t, longSystem, "second")
				pl.Prepare(context.Background(), f)
				scores(pl, f, eps)
				m := MatchesOf(f)
				pl.Done(f, eps[1])
				return m
			}
			m := follower()
			if m.Blocks(eps[0]) < 10 {
				t.Fatalf("follower matches %d blocks on the picked endpoint", m.Blocks(eps[0]))
			}
			if m.Pending(eps[0]) != stream {
				t.Fatalf("after the headers the match is pending: %v, want %v", m.Pending(eps[0]), stream)
			}
			pl.FirstByte(req, eps[0])
			if m := follower(); m.Pending(eps[0]) || m.Blocks(eps[0]) < 10 {
				t.Fatalf("after the first byte: pending %v, %d blocks; want a committed match", m.Pending(eps[0]), m.Blocks(eps[0]))
			}
			pl.Done(req, eps[0])
		})
	}
}

// TestAPrefixManyWaitForIsNotQueuedBehindOneEndpoint: one request computing a new prefix draws
// a follower to share its prefill; once two are waiting for it, the prefix is hot and the
// pending match no longer earns a prefix score (the committed index still does), so that other
// endpoints compute it in parallel.
func TestAPrefixManyWaitForIsNotQueuedBehindOneEndpoint(t *testing.T) {
	pl := testPlugin(t)
	eps := twoEndpoints()
	pick := func(q string) (*router.Request, []float64) {
		r := chatRequest(t, longSystem, q)
		r.Body.Stream = true
		pl.Prepare(context.Background(), r)
		s := scores(pl, r, eps)
		pl.Picked(r, eps[0])
		pl.ResponseHeaders(r, eps[0], 200) // a stream: pending until its first byte
		return r, s
	}
	first, _ := pick("one")
	second, s2 := pick("two")
	if s2[0] < 0.5 {
		t.Fatalf("the first follower scores %v on the endpoint computing the prefix, want a high prefix score", s2)
	}
	third, s3 := pick("three")
	if s3[0] != 0 {
		t.Fatalf("with two requests waiting for the prefix, the third scores %v on their endpoint, want 0 (pending no longer counts)", s3)
	}
	pl.FirstByte(first, eps[0]) // committed now
	fourth, s4 := pick("four")
	if s4[0] < 0.5 {
		t.Fatalf("once the prefix is committed the endpoint scores %v, want its committed match", s4)
	}
	for _, r := range []*router.Request{first, second, third, fourth} {
		pl.Done(r, eps[0])
	}
}

// TestRequestsPastTheirPrefillDoNotMakeAPrefixLookHot: requests that do not stream stay pending
// until their answers end. Once the endpoint's prefills are known over through their picks, the
// prompt is in its cache: followers score it there like a committed match, instead of taking the
// prefix for one that several requests still wait on and computing it again elsewhere.
func TestRequestsPastTheirPrefillDoNotMakeAPrefixLookHot(t *testing.T) {
	pl := testPlugin(t)
	eps := twoEndpoints()
	var seq int64
	pick := func(q string) (*router.Request, []float64) {
		r := chatRequest(t, longSystem, q) // not streamed: pending until its answer ends
		pl.Prepare(context.Background(), r)
		s := scores(pl, r, eps)
		seq++
		r.PickSeq = seq
		pl.Picked(r, eps[0])
		return r, s
	}
	first, _ := pick("one")
	second, _ := pick("two")
	third, s3 := pick("three")
	if s3[0] != 0 {
		t.Fatalf("with two requests prefilling the prefix, the third scores %v there, want 0", s3)
	}
	eps[0].SetPrefilledThrough(2) // the first two are past their prefill; the third is not
	fourth, s4 := pick("four")
	if s4[0] < 0.5 {
		t.Fatalf("with the prefix prefilled there (one request still prefilling), the fourth scores %v, want its match", s4)
	}
	for _, r := range []*router.Request{first, second, third, fourth} {
		pl.Done(r, eps[0])
	}
}

// pickStream scores a streamed request with longSystem's system prompt and picks on for it.
func pickStream(t *testing.T, pl *Plugin, eps []*router.Endpoint, on *router.Endpoint) *router.Request {
	t.Helper()
	req := chatRequest(t, longSystem, "first question")
	req.Body.Stream = true
	pl.Prepare(context.Background(), req)
	scores(pl, req, eps)
	pl.Picked(req, on)
	return req
}

// scoreNext scores another question behind longSystem and returns it with its matches.
func scoreNext(t *testing.T, pl *Plugin, eps []*router.Endpoint) (*router.Request, Matches) {
	t.Helper()
	next := chatRequest(t, longSystem, "another question")
	pl.Prepare(context.Background(), next)
	scores(pl, next, eps)
	return next, MatchesOf(next)
}

// TestRunningBlocksCountOnlyRequestsStillRunning: a prompt's blocks that requests running on an
// endpoint reference take no free KV room there; a prefix the endpoint caches but no running
// request uses does (vLLM counts such blocks as free), so it is not counted.
func TestRunningBlocksCountOnlyRequestsStillRunning(t *testing.T) {
	tests := []struct {
		name string
		// what the earlier request did: "running" (picked, its stream not ended), "streaming"
		// (first byte out: committed to the index, still running), "ended" (answered and done)
		earlier     string
		earlierOn   int
		wantRunning [2]bool // RunningBlocks covers the shared system prompt on endpoint 0, 1
		wantHeld    [2]bool // Blocks (index and pending) covers it
	}{
		{"a request still prefilling is running", "running", 0, [2]bool{true, false}, [2]bool{true, false}},
		{"a request streaming its answer is running", "streaming", 1, [2]bool{false, true}, [2]bool{false, true}},
		{"an ended request is cached but not running", "ended", 0, [2]bool{false, false}, [2]bool{true, false}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pl, eps := testPlugin(t), twoEndpoints()
			pl.KeepRunningRecords()
			first := pickStream(t, pl, eps, eps[tc.earlierOn])
			switch tc.earlier {
			case "streaming":
				pl.ResponseHeaders(first, eps[tc.earlierOn], 200)
				pl.FirstByte(first, eps[tc.earlierOn])
			case "ended":
				pl.ResponseHeaders(first, eps[tc.earlierOn], 200)
				pl.FirstByte(first, eps[tc.earlierOn])
				pl.Done(first, eps[tc.earlierOn])
			}
			next, m := scoreNext(t, pl, eps)
			system := len(longSystem) / 64 // full blocks of the system prompt alone, at least
			for i, e := range eps {
				if got := m.RunningBlocks(e) >= system; got != tc.wantRunning[i] {
					t.Errorf("endpoint %d: RunningBlocks %d of %d, want the system prompt's %d covered = %v",
						i, m.RunningBlocks(e), m.Total, system, tc.wantRunning[i])
				}
				if got := m.Blocks(e) >= system; got != tc.wantHeld[i] {
					t.Errorf("endpoint %d: Blocks %d, want the system prompt covered = %v", i, m.Blocks(e), tc.wantHeld[i])
				}
				if m.RunningBlocks(e) >= m.Total {
					t.Errorf("endpoint %d: the new question's blocks counted as running (%d of %d)", i, m.RunningBlocks(e), m.Total)
				}
			}
			if tc.earlier != "ended" {
				pl.Done(first, eps[tc.earlierOn])
			}
			if n := pl.RunningCount(); n != 0 {
				t.Fatalf("%d running records left after every stream ended", n)
			}
			// Scored again after the end, nothing runs anywhere.
			scores(pl, next, eps)
			m = MatchesOf(next)
			for i, e := range eps {
				if m.RunningBlocks(e) != 0 {
					t.Errorf("endpoint %d: %d running blocks after every stream ended", i, m.RunningBlocks(e))
				}
			}
		})
	}
}

// TestRunningRecordFollowsTheAnswer: the running record sits on the endpoint that answered
// (the proxy may retry on another than the one picked) and goes with an error answer.
func TestRunningRecordFollowsTheAnswer(t *testing.T) {
	tests := []struct {
		name        string
		answeredBy  int
		status      int
		wantRunning [2]bool
	}{
		{"answered by the endpoint picked", 0, 200, [2]bool{true, false}},
		{"answered by another after a retry", 1, 200, [2]bool{false, true}},
		{"an error answer ends the request", 0, 503, [2]bool{false, false}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pl, eps := testPlugin(t), twoEndpoints()
			pl.KeepRunningRecords()
			first := pickStream(t, pl, eps, eps[0])
			pl.ResponseHeaders(first, eps[tc.answeredBy], tc.status)
			_, m := scoreNext(t, pl, eps)
			for i, e := range eps {
				if got := m.RunningBlocks(e) > 0; got != tc.wantRunning[i] {
					t.Errorf("endpoint %d: RunningBlocks %d, want running there = %v", i, m.RunningBlocks(e), tc.wantRunning[i])
				}
			}
			pl.Done(first, eps[tc.answeredBy])
			if n := pl.RunningCount(); n != 0 {
				t.Fatalf("%d running records left after the stream ended", n)
			}
		})
	}
}
