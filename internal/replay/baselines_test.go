package replay

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvpick/kvpick/internal/engine"
)

// chatRequest is a chat request whose messages are a system prompt and a question.
func chatRequest(t *testing.T, id int, system, question string) *Request {
	t.Helper()
	body, err := json.Marshal(map[string]any{"model": Model, "max_tokens": 10, "messages": []map[string]string{
		{"role": "system", "content": system}, {"role": "user", "content": question}}})
	if err != nil {
		t.Fatal(err)
	}
	return &Request{ID: id, Path: "/v1/chat/completions", Body: body}
}

// board returns a metrics board of n idle engines of 4,096 blocks.
func idleBoard(n int) *metricsBoard {
	b := &metricsBoard{stats: make([]engine.Stats, n)}
	for i := range b.stats {
		b.stats[i] = engine.Stats{NumGPUBlocks: 4096, BlockSize: 16}
	}
	return b
}

// TestGIEFollowsItsWeights: the prefix scorer (weight 3) against the queue scorer (weight 2).
// The first request's messages JSON is ~2,070 characters: 32 blocks of 64. A second request
// with the same system prompt and a short question matches all 32 of its blocks on the
// first's engine, and goes there while the queues are equal. When that engine has the longest
// waiting queue (queue score 0, the others 1) it still wins with the full match (3 × 1 = 3 > 2)
// but loses when a 2,100-character question halves the match (32 of 65 blocks: 3 × 0.49 =
// 1.48 < 2). The KV-cache scorer is 1 everywhere (idle engines).
func TestGIEFollowsItsWeights(t *testing.T) {
	system := strings.Repeat("abcdefghij", 200) // 2,000 characters: 31 of ~34 blocks
	for _, tc := range []struct {
		name        string
		question    string // of the second request; the first asks "first"
		queue0      int
		wantEngine0 bool
	}{
		{"equal queues, full match", "second", 0, true},
		{"long queue, full match", "second", 5, true},
		{"long queue, half match", strings.Repeat("x", 2100), 5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := idleBoard(3)
			p := newGIE(3, b, 1)
			// Whichever engine the first request went to (a random tie) plays "engine 0".
			e0 := p.pick(chatRequest(t, 0, system, "first"), Epoch)
			b.stats[e0].Waiting = tc.queue0
			r := chatRequest(t, 1, system, tc.question)
			total := len(gieHashes(r))
			match := make([]int, 3)
			p.idx.matchLongestPrefix(gieHashes(r), match)
			got := p.pick(r, Epoch)
			if (got == e0) != tc.wantEngine0 {
				t.Fatalf("picked %d (first request on %d); engine %d matches %d of %d blocks, queue %d", got, e0, e0,
					match[e0], total, tc.queue0)
			}
		})
	}
}

// TestGIEIndexEvictsHeadFirst: a server's LRU holds num_gpu_blocks hashes (from its metrics)
// and takes a prompt's blocks head first, so when the prompt does not fit its head block is
// the first to go, and then nothing matches at all: GIE's match stops at the first block no
// server holds.
func TestGIEIndexEvictsHeadFirst(t *testing.T) {
	b := idleBoard(2)
	b.stats[0].NumGPUBlocks, b.stats[1].NumGPUBlocks = 10, 10
	p := newGIE(2, b, 1)
	r := chatRequest(t, 0, strings.Repeat("0123456789", 130), "q") // ~21 blocks
	hashes := gieHashes(r)
	if len(hashes) < 15 {
		t.Fatalf("%d blocks", len(hashes))
	}
	e := p.pick(r, Epoch)
	if n := p.idx.servers[e].order.Len(); n != 10 {
		t.Fatalf("LRU holds %d hashes, want its 10 num_gpu_blocks", n)
	}
	if p.idx.holders[hashes[len(hashes)-1]] == nil || p.idx.holders[hashes[0]] != nil {
		t.Fatal("the tail should be kept and the head evicted")
	}
	match := make([]int, 2)
	p.idx.matchLongestPrefix(hashes, match)
	if match[0] != 0 || match[1] != 0 {
		t.Fatalf("match %v after the head was evicted, want none", match)
	}
	// A board without metrics: the default 31,250 entries.
	p2 := newGIE(2, &metricsBoard{stats: make([]engine.Stats, 2)}, 1)
	e = p2.pick(r, Epoch)
	if c := p2.idx.servers[e].capacity; c != 31250 {
		t.Fatalf("capacity %d without metrics, want 31250", c)
	}
}

// TestGIEBreaksTiesAtRandom: on an idle pool every score is equal; the picks spread over the
// engines, the same way for the same seed.
func TestGIEBreaksTiesAtRandom(t *testing.T) {
	picks := func(seed uint64) []int {
		p := newGIE(4, idleBoard(4), seed)
		var out []int
		for i := range 40 {
			out = append(out, p.pick(chatRequest(t, i, fmt.Sprint("short ", i), "q"), Epoch))
			p.idx = newGIEIndex(4) // no prefix from the previous picks
		}
		return out
	}
	a, b := picks(3), picks(3)
	seen := map[int]bool{}
	for i := range a {
		seen[a[i]] = true
		if a[i] != b[i] {
			t.Fatalf("same seed, different picks: %v %v", a, b)
		}
	}
	if len(seen) != 4 {
		t.Fatalf("ties went to %d of 4 engines: %v", len(seen), a)
	}
}

// TestSGLangSwitchesToShortestQueueBeyondBothThresholds: the cache-aware choice stands unless
// the load gap exceeds 64 requests AND the busiest has more than 1.5 times the idlest's.
func TestSGLangSwitchesToShortestQueueBeyondBothThresholds(t *testing.T) {
	system := strings.Repeat("the same system prompt ", 40)
	for _, tc := range []struct {
		name   string
		loads  [2]int // in flight on the engine holding the prefix, and on the other
		follow bool   // the request follows its prefix
	}{
		{"balanced", [2]int{10, 10}, true},
		{"gap 60, ratio 2.5: under the absolute threshold", [2]int{100, 40}, true},
		{"gap 90, ratio 1.43: under the relative threshold", [2]int{300, 210}, true},
		{"gap 70, ratio 3.3: over both", [2]int{100, 30}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newSGLang(2, 1)
			holder := p.pick(chatRequest(t, 0, system, "first question"), Epoch)
			other := 1 - holder
			p.load[holder], p.load[other] = tc.loads[0], tc.loads[1]
			got := p.pick(chatRequest(t, 1, system, "second question"), Epoch)
			if (got == holder) != tc.follow {
				t.Fatalf("loads %v: picked %d, prefix on %d", tc.loads, got, holder)
			}
		})
	}
}

// TestSGLangMatchThreshold: a request whose text matches more than 30% of a worker's goes
// there; one matching less goes to the worker whose tree holds the fewest characters.
func TestSGLangMatchThreshold(t *testing.T) {
	p := newSGLang(3, 1)
	a := p.pick(chatRequest(t, 0, strings.Repeat("a", 1000), "q1"), Epoch) // "aaa... q1"
	b := p.pick(chatRequest(t, 1, strings.Repeat("b", 300), "q2"), Epoch)
	if a == b {
		t.Fatalf("the second, unrelated request went to the first's worker %d: the idle third holds less", a)
	}
	// 1,000 of ~1,400 characters match worker a's text (71%): follow it.
	if got := p.pick(chatRequest(t, 2, strings.Repeat("a", 1000), strings.Repeat("z", 400)), Epoch); got != a {
		t.Fatalf("a 71%% match went to %d, not %d", got, a)
	}
	// 300 of ~1,300 characters match worker b's (23%): the smallest tree, the third worker.
	c := 3 - a - b
	if got := p.pick(chatRequest(t, 3, strings.Repeat("b", 300), strings.Repeat("y", 1000)), Epoch); got != c {
		t.Fatalf("a 23%% match went to %d, want the emptiest worker %d (chars %v)", got, c, p.tree.chars)
	}
}

// TestSGLangLoadIsItsOwnInFlightCount: load rises when a request is sent and falls when it
// ends, whatever the engines report.
func TestSGLangLoadIsItsOwnInFlightCount(t *testing.T) {
	p := newSGLang(2, 1)
	r := chatRequest(t, 0, "x", "y")
	e := p.pick(r, Epoch)
	p.submitted(e, r, Epoch)
	p.submitted(e, r, Epoch)
	if p.load[e] != 2 {
		t.Fatalf("load %v", p.load)
	}
	p.done(e, r, engine.Result{})
	if p.load[e] != 1 {
		t.Fatalf("load %v after one ended", p.load)
	}
}

// TestSGLangEvictsLeastRecentlyUsedLeaves: every eviction interval a worker's tree over the
// size cap loses its oldest leaves until it is under; the texts it used last stay.
func TestSGLangEvictsLeastRecentlyUsedLeaves(t *testing.T) {
	tr := newRadixTree(1)
	for i, s := range []string{"old-aaaaaaaaaa", "mid-bbbbbbbbbb", "new-cccccccccc"} {
		tr.insert(s, 0)
		if tr.chars[0] != 14*(i+1) {
			t.Fatalf("after %d inserts the tree holds %d characters", i+1, tr.chars[0])
		}
	}
	tr.evict(30)
	if tr.chars[0] > 30 {
		t.Fatalf("%d characters after eviction to 30", tr.chars[0])
	}
	for s, want := range map[string]int{"old-aaaaaaaaaa": 0, "new-cccccccccc": 14} {
		if n, _ := tr.prefixMatch(s); n != want {
			t.Fatalf("%s: %d characters still matched, want %d", s, n, want)
		}
	}
	// Through the policy: the cap applies once an interval has passed.
	p := newSGLang(1, 1)
	p.maxTreeSize = 10
	p.pick(chatRequest(t, 0, strings.Repeat("s", 50), "q"), Epoch)
	p.pick(chatRequest(t, 1, "t", "q"), Epoch.Add(time.Second))
	if p.tree.chars[0] <= 10 {
		t.Fatal("evicted before the interval")
	}
	p.pick(chatRequest(t, 2, "u", "q"), Epoch.Add(sglangEvictEvery+time.Second))
	if c := p.tree.chars[0]; c > 10+len("u q") {
		t.Fatalf("%d characters after the eviction interval, cap 10", c)
	}
}

func TestSGLangRoutingTextIsTheMessageContents(t *testing.T) {
	r := &Request{Path: "/v1/chat/completions", Body: []byte(`{"model":"m","messages":[{"role":"system","content":"sys"},` +
		`{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]},` +
		`{"role":"assistant","content":"c"},{"role":"tool","tool_call_id":"1","content":"d"}],"tools":[{"type":"function"}]}`)}
	if got := sglangText(r); got != "sys a b c d" {
		t.Fatalf("chat text %q", got)
	}
	r = &Request{Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":"once upon"}`)}
	if got := sglangText(r); got != "once upon" {
		t.Fatalf("completion text %q", got)
	}
}

// TestReplicatedRoutersEachLearnOnlyTheirOwnRequests: two gie replicas take requests in turn
// and each remembers only the prompts it routed itself: a prompt the first replica placed is
// matched again when the first replica routes it, never by the second (which places it by its
// own tie-break), and one router alone matches it every time. The references (least-loaded)
// are never replicated.
func TestReplicatedRoutersEachLearnOnlyTheirOwnRequests(t *testing.T) {
	system := strings.Repeat("abcdefghij", 200)
	lone := newBaseline(GIE, make([]*engine.Engine, 8), engine.Config{}, idleBoard(8), 1, 1)
	if _, ok := lone.(*gie); !ok {
		t.Fatalf("one replica: %T, want *gie", lone)
	}
	if ll := newBaseline(LeastLoaded, nil, engine.Config{}, idleBoard(8), 1, 2); ll == nil {
		t.Fatal("least-loaded with replicas: nil")
	} else if _, ok := ll.(*replicated); ok {
		t.Fatal("least-loaded was replicated")
	}
	two := newBaseline(GIE, make([]*engine.Engine, 8), engine.Config{}, idleBoard(8), 1, 2)
	rp, ok := two.(*replicated)
	if !ok || len(rp.insts) != 2 {
		t.Fatalf("two replicas: %T", two)
	}
	first := two.pick(chatRequest(t, 0, system, "q0"), Epoch)
	loneFirst := lone.pick(chatRequest(t, 0, system, "q0"), Epoch)
	// Requests 2, 4, ... reach the first replica, which matches the prompt; 1, 3, ... the
	// second, which never saw it: it places request 1 by its own random tie-break among the 8
	// idle engines (with these seeds, another engine than the first replica's) and keeps the
	// prompt there.
	elsewhere := 0
	for i := 1; i <= 20; i++ {
		r := chatRequest(t, i, system, fmt.Sprintf("q%d", i))
		got := two.pick(r, Epoch)
		two.done(got, r, engine.Result{})
		if i%2 == 0 && got != first {
			t.Fatalf("request %d reached the replica that placed the prompt on %d, went to %d", i, first, got)
		}
		if i%2 == 1 && got != first {
			elsewhere++
		}
		if l := lone.pick(r, Epoch); l != loneFirst {
			t.Fatalf("one router: request %d went to %d, the prompt is on %d", i, l, loneFirst)
		}
	}
	if elsewhere != 10 {
		t.Fatalf("the second replica sent %d of its 10 requests elsewhere than the first replica's engine, want all: "+
			"the replicas share their index, or its own placement did not stick", elsewhere)
	}
	if len(rp.owner) != 1 { // request 0 never finished
		t.Fatalf("finished requests still tracked: %d", len(rp.owner))
	}
}
