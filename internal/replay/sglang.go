package replay

import (
	"container/heap"
	"encoding/json"
	"strings"
	"time"

	"github.com/kvpick/kvpick/internal/engine"
)

// sglang is SGLang's cache-aware router (sgl-router's cache_aware policy), rebuilt from its
// documented behaviour with the defaults of its launcher (sglang_router's RouterArgs:
// cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold 1.5,
// eviction_interval_secs 120, max_tree_size 2^26; docs/replay.md, "Policies"):
//
//   - load is the router's own count of requests in flight per worker (routed, not finished);
//     no model-server metrics.
//   - When max load − min load > balance_abs_threshold AND max load > min load ×
//     balance_rel_threshold, the least-loaded worker gets the request (first in worker order
//     among equals).
//   - Otherwise the request's routing text (a completion's prompt; a chat's message contents
//     joined by spaces) is matched in one approximate radix tree of raw characters shared by
//     all workers, each node knowing which workers hold it. Match ratio = matched / text
//     characters; above cache_threshold the request goes to a worker holding the deepest
//     matched node, else to the worker whose tree holds the fewest characters.
//   - Either way the text is then inserted for the chosen worker.
//   - Every eviction_interval the tree of every worker holding more than max_tree_size
//     characters loses its least recently used leaves until it is back under.
//
// Ties between workers (holders of the matched node, equal smallest trees) go by a fixed
// order drawn from the seed: sgl-router takes the first key of a concurrent hash map, an
// arbitrary order that stays the same while the router runs.
type sglang struct {
	n              int
	load           []int
	tree           *radixTree
	pref           []int // workers in tie-break order
	cacheThreshold float64
	absThreshold   int
	relThreshold   float64
	evictEvery     time.Duration
	maxTreeSize    int
	lastEvict      time.Time
}

// sgl-router launch defaults.
const (
	sglangCacheThreshold = 0.3
	sglangAbsThreshold   = 64
	sglangRelThreshold   = 1.5
	sglangEvictEvery     = 120 * time.Second
	sglangMaxTreeSize    = 1 << 26
)

func newSGLang(n int, seed uint64) *sglang {
	p := &sglang{n: n, load: make([]int, n), tree: newRadixTree(n), pref: newRand(seed, "sglang/tenant-order").Perm(n),
		cacheThreshold: sglangCacheThreshold, absThreshold: sglangAbsThreshold, relThreshold: sglangRelThreshold,
		evictEvery: sglangEvictEvery, maxTreeSize: sglangMaxTreeSize}
	return p
}

func (p *sglang) pick(r *Request, now time.Time) int {
	if p.lastEvict.IsZero() {
		p.lastEvict = now
	}
	for p.evictEvery > 0 && now.Sub(p.lastEvict) >= p.evictEvery {
		p.tree.evict(p.maxTreeSize)
		p.lastEvict = p.lastEvict.Add(p.evictEvery)
	}
	text := sglangText(r)
	minL, maxL := p.load[0], p.load[0]
	for _, l := range p.load[1:] {
		minL, maxL = min(minL, l), max(maxL, l)
	}
	if maxL-minL > p.absThreshold && float64(maxL) > float64(minL)*p.relThreshold {
		e := 0
		for i, l := range p.load {
			if l < p.load[e] {
				e = i
			}
		}
		p.tree.insert(text, e)
		return e
	}
	matched, node := p.tree.prefixMatch(text)
	e := -1
	if len(text) > 0 && float64(matched)/float64(len(text)) > p.cacheThreshold {
		e = p.first(func(t int) bool { return node.access[t] != 0 })
		p.tree.touchPath(node, e)
	}
	if e < 0 {
		e = p.tree.smallest(p.pref)
	}
	p.tree.insert(text, e)
	return e
}

// first returns the first worker in tie-break order that ok accepts (-1 if none).
func (p *sglang) first(ok func(int) bool) int {
	for _, t := range p.pref {
		if ok(t) {
			return t
		}
	}
	return -1
}

func (p *sglang) submitted(e int, _ *Request, _ time.Time) { p.load[e]++ }
func (p *sglang) firstToken(int, *Request, engine.Result)  {}
func (p *sglang) done(e int, _ *Request, _ engine.Result)  { p.load[e]-- }

// sglangText is sgl-router's routing text of a request.
func sglangText(r *Request) string {
	var body struct {
		Prompt   json.RawMessage `json:"prompt"`
		Messages []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(r.Body, &body); err != nil {
		return ""
	}
	if strings.HasSuffix(r.Path, "/v1/completions") {
		var s string
		if json.Unmarshal(body.Prompt, &s) == nil {
			return s
		}
		var ss []string
		if json.Unmarshal(body.Prompt, &ss) == nil {
			return strings.Join(ss, " ")
		}
		return ""
	}
	var parts []string
	for _, m := range body.Messages {
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			if s != "" {
				parts = append(parts, s)
			}
			continue
		}
		var list []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal(m.Content, &list) == nil {
			var texts []string
			for _, c := range list {
				if c.Type == "text" {
					texts = append(texts, c.Text)
				}
			}
			parts = append(parts, strings.Join(texts, " "))
		}
	}
	return strings.Join(parts, " ")
}

// radixTree is sgl-router's approximate tree: a radix tree over characters (here bytes, the
// same for ASCII text) shared by every worker ("tenant"); each node records, per tenant that
// holds it, when the tenant last used it.
type radixTree struct {
	root  *rnode
	chars []int // characters held per tenant
	clock int64 // logical time of accesses (sgl-router: milliseconds)
}

type rnode struct {
	text     string
	children map[byte]*rnode
	parent   *rnode
	access   []int64 // per tenant; 0: does not hold the node
}

func newRadixTree(n int) *radixTree {
	t := &radixTree{root: &rnode{children: map[byte]*rnode{}, access: make([]int64, n)}, chars: make([]int, n)}
	for e := range n {
		t.root.access[e] = 1 // every worker starts with the empty text
	}
	t.clock = 1
	return t
}

func sharedPrefix(a, b string) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

func (t *radixTree) hold(nd *rnode, e int) {
	if nd.access[e] == 0 {
		t.chars[e] += len(nd.text)
	}
	nd.access[e] = t.clock
}

// insert records that tenant e holds text.
func (t *radixTree) insert(text string, e int) {
	t.clock++
	t.root.access[e] = t.clock
	prev := t.root
	for i := 0; i < len(text); {
		child := prev.children[text[i]]
		if child == nil {
			nd := &rnode{text: text[i:], children: map[byte]*rnode{}, parent: prev, access: make([]int64, len(t.chars))}
			t.hold(nd, e)
			prev.children[text[i]] = nd
			return
		}
		shared := sharedPrefix(child.text, text[i:])
		if shared < len(child.text) {
			mid := &rnode{text: child.text[:shared], children: map[byte]*rnode{}, parent: prev,
				access: append([]int64(nil), child.access...)}
			child.text = child.text[shared:]
			child.parent = mid
			mid.children[child.text[0]] = child
			prev.children[text[i]] = mid
			child = mid
		}
		t.hold(child, e)
		prev = child
		i += shared
	}
}

// prefixMatch returns how many leading characters of text the tree holds and the deepest
// node reached (a partially matched node counts, as in sgl-router).
func (t *radixTree) prefixMatch(text string) (int, *rnode) {
	nd, i := t.root, 0
	for i < len(text) {
		child := nd.children[text[i]]
		if child == nil {
			break
		}
		shared := sharedPrefix(child.text, text[i:])
		i += shared
		nd = child
		if shared < len(child.text) {
			break
		}
	}
	return i, nd
}

// touchPath marks tenant e's use of the path from nd up to the root.
func (t *radixTree) touchPath(nd *rnode, e int) {
	t.clock++
	for ; nd != nil; nd = nd.parent {
		if nd.access[e] != 0 {
			nd.access[e] = t.clock
		}
	}
}

// smallest returns the tenant holding the fewest characters, the first in order among equals.
func (t *radixTree) smallest(order []int) int {
	best := order[0]
	for _, e := range order[1:] {
		if t.chars[e] < t.chars[best] {
			best = e
		}
	}
	return best
}

// evict drops, for every tenant holding more than maxChars characters, its least recently used
// leaves until it holds at most maxChars.
func (t *radixTree) evict(maxChars int) {
	for e := range t.chars {
		if t.chars[e] <= maxChars {
			continue
		}
		h := &leafHeap{e: e}
		t.walk(t.root, func(nd *rnode) {
			if nd != t.root && nd.access[e] != 0 && !t.hasTenantChild(nd, e) {
				h.nodes = append(h.nodes, nd)
			}
		})
		heap.Init(h)
		for t.chars[e] > maxChars && h.Len() > 0 {
			nd := heap.Pop(h).(*rnode)
			nd.access[e] = 0
			t.chars[e] -= len(nd.text)
			parent := nd.parent
			if len(nd.children) == 0 && !holdsAny(nd) {
				delete(parent.children, nd.text[0])
			}
			if parent != t.root && parent.access[e] != 0 && !t.hasTenantChild(parent, e) {
				heap.Push(h, parent)
			}
		}
	}
}

func (t *radixTree) walk(nd *rnode, f func(*rnode)) {
	f(nd)
	for _, c := range nd.children {
		t.walk(c, f)
	}
}

func (t *radixTree) hasTenantChild(nd *rnode, e int) bool {
	for _, c := range nd.children {
		if c.access[e] != 0 {
			return true
		}
	}
	return false
}

func holdsAny(nd *rnode) bool {
	for _, a := range nd.access {
		if a != 0 {
			return true
		}
	}
	return false
}

// leafHeap orders one tenant's leaves by last access, oldest first.
type leafHeap struct {
	e     int
	nodes []*rnode
}

func (h *leafHeap) Len() int           { return len(h.nodes) }
func (h *leafHeap) Less(i, j int) bool { return h.nodes[i].access[h.e] < h.nodes[j].access[h.e] }
func (h *leafHeap) Swap(i, j int)      { h.nodes[i], h.nodes[j] = h.nodes[j], h.nodes[i] }
func (h *leafHeap) Push(x any)         { h.nodes = append(h.nodes, x.(*rnode)) }
func (h *leafHeap) Pop() any {
	n := len(h.nodes)
	x := h.nodes[n-1]
	h.nodes = h.nodes[:n-1]
	return x
}
