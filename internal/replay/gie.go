package replay

import (
	"bytes"
	clist "container/list"
	"encoding/binary"
	"encoding/json"
	"math/bits"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
)

// gie is the Gateway API Inference Extension endpoint picker with its documented default
// scheduling profile, rebuilt from its documented behaviour (docs/replay.md, "Policies"):
//
//   - prefix-cache-scorer, weight 3: the request's "user input" (the prompt of a completion,
//     the JSON encoding of a chat's messages) cut into blocks of 64 characters (16 tokens × 4
//     characters), at most 256 of them; hash chain h0 = xxhash(model ‖ cache_salt),
//     h_i = xxhash(block_i ‖ h_{i-1}); score = matched blocks / blocks, where walking the blocks
//     in order until one no server holds, every server holding a block gets one more. Each
//     server has an LRU of num_gpu_blocks entries (31,250 until its metrics report it), filled
//     right after the pick (optimistically, so also for requests that fail), head block
//     first, so a prompt's head is its first block evicted.
//   - queue-scorer, weight 2: waiting requests (vllm:num_requests_waiting), min-max normalised
//     over the candidates (all equal: 1).
//   - kv-cache-utilization-scorer, weight 2: 1 − vllm:kv_cache_usage_perc.
//   - max-score-picker: the highest weighted sum, ties broken at random.
//
// The metrics are the last snapshot (metricsBoard), refreshed every 50 ms of simulated time as
// GIE's --refresh-metrics-interval does.
type gie struct {
	hooksNone
	n     int
	board *metricsBoard
	rng   *rand.Rand
	idx   *gieIndex

	scores []float64
	match  []int
	order  []int
}

const (
	gieBlockChars      = 16 * 4 // DefaultBlockSizeTokens × averageCharactersPerToken
	gieMaxBlocks       = 256
	gieDefaultCapacity = 31250
	giePrefixWeight    = 3.0
	gieQueueWeight     = 2.0
	gieKVWeight        = 2.0
)

func newGIE(n int, board *metricsBoard, seed uint64) *gie {
	return &gie{n: n, board: board, rng: newRand(seed, "gie/tie-break"), idx: newGIEIndex(n),
		scores: make([]float64, n), match: make([]int, n), order: make([]int, n)}
}

func (p *gie) pick(r *Request, _ time.Time) int {
	hashes := gieHashes(r)
	clear(p.match)
	p.idx.matchLongestPrefix(hashes, p.match)
	minQ, maxQ := int(^uint(0)>>1), -1
	for e := range p.n {
		q := p.board.stats[e].Waiting
		minQ, maxQ = min(minQ, q), max(maxQ, q)
	}
	for e := range p.n {
		st := &p.board.stats[e]
		prefix := 0.0
		if len(hashes) > 0 {
			prefix = float64(p.match[e]) / float64(len(hashes))
		}
		queue := 1.0
		if maxQ > minQ {
			queue = float64(maxQ-st.Waiting) / float64(maxQ-minQ)
		}
		p.scores[e] = giePrefixWeight*prefix + gieQueueWeight*queue + gieKVWeight*(1-st.KVUsage)
	}
	// Shuffle, then the first highest score: a random tie-break.
	for i := range p.order {
		p.order[i] = i
	}
	p.rng.Shuffle(p.n, func(i, j int) { p.order[i], p.order[j] = p.order[j], p.order[i] })
	best := p.order[0]
	for _, e := range p.order[1:] {
		if p.scores[e] > p.scores[best] {
			best = e
		}
	}
	capacity := gieDefaultCapacity
	if b := p.board.stats[best].NumGPUBlocks; b > 0 {
		capacity = b
	}
	p.idx.add(hashes, best, capacity)
	return best
}

// gieHashes is the prefix-cache scorer's block-hash chain of a request.
func gieHashes(r *Request) []uint64 {
	input, model, salt := gieUserInput(r)
	if len(input) < gieBlockChars {
		return nil
	}
	if len(input) > gieBlockChars*gieMaxBlocks {
		input = input[:gieBlockChars*gieMaxBlocks]
	}
	d := xxhash.New()
	_, _ = d.WriteString(model)
	_, _ = d.WriteString(salt)
	prev := d.Sum64()
	out := make([]uint64, 0, len(input)/gieBlockChars)
	var le [8]byte
	for i := 0; i+gieBlockChars <= len(input); i += gieBlockChars {
		d.Reset()
		_, _ = d.Write(input[i : i+gieBlockChars])
		binary.LittleEndian.PutUint64(le[:], prev)
		_, _ = d.Write(le[:])
		prev = d.Sum64()
		out = append(out, prev)
	}
	return out
}

// gieUserInput is what GIE hashes: a completion's prompt, or the JSON encoding of a chat's
// messages (role and content of each, as its request parser keeps them), with the model and
// cache_salt that seed the chain.
func gieUserInput(r *Request) (input []byte, model, salt string) {
	var body struct {
		Model     string `json:"model"`
		CacheSalt string `json:"cache_salt"`
		Prompt    any    `json:"prompt"`
		Messages  []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(r.Body, &body); err != nil {
		return nil, "", ""
	}
	if strings.HasSuffix(r.Path, "/v1/completions") {
		if s, ok := body.Prompt.(string); ok {
			return []byte(s), body.Model, body.CacheSalt
		}
		return nil, body.Model, body.CacheSalt // token arrays: GIE does not hash them
	}
	type message struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	msgs := make([]message, len(body.Messages))
	for i, m := range body.Messages {
		c := m.Content
		if len(bytes.TrimSpace(c)) == 0 {
			c = json.RawMessage("null")
		}
		msgs[i] = message{m.Role, c}
	}
	b, err := json.Marshal(msgs)
	if err != nil {
		return nil, body.Model, body.CacheSalt
	}
	return b, body.Model, body.CacheSalt
}

// gieIndex is GIE's approximate prefix index: per server an LRU of block hashes, and which
// servers may hold each hash.
type gieIndex struct {
	servers []*gieLRU
	holders map[uint64][]uint64 // bitset of servers
	words   int
}

type gieLRU struct {
	capacity int
	order    clist.List // of uint64, most recent first
	at       map[uint64]*clist.Element
}

func newGIEIndex(n int) *gieIndex {
	return &gieIndex{servers: make([]*gieLRU, n), holders: map[uint64][]uint64{}, words: (n + 63) / 64}
}

// matchLongestPrefix adds to res[e], for each block from the first until one no server holds,
// one for every server e holding it.
func (x *gieIndex) matchLongestPrefix(hashes []uint64, res []int) {
	for _, h := range hashes {
		set := x.holders[h]
		if set == nil {
			return
		}
		for w, b := range set {
			for ; b != 0; b &= b - 1 {
				res[w*64+bits.TrailingZeros64(b)]++
			}
		}
	}
}

// add records that server e holds hashes, inserting them head first into its LRU, created with
// capacity entries at its first use (and never resized, as GIE does).
func (x *gieIndex) add(hashes []uint64, e, capacity int) {
	s := x.servers[e]
	if s == nil {
		s = &gieLRU{capacity: capacity, at: map[uint64]*clist.Element{}}
		x.servers[e] = s
	}
	for _, h := range hashes {
		if el, ok := s.at[h]; ok {
			s.order.MoveToFront(el)
		} else {
			s.at[h] = s.order.PushFront(h)
			set := x.holders[h]
			if set == nil {
				set = make([]uint64, x.words)
				x.holders[h] = set
			}
			set[e/64] |= 1 << (e % 64)
		}
		for s.order.Len() > s.capacity {
			old := s.order.Remove(s.order.Back()).(uint64)
			delete(s.at, old)
			x.drop(old, e)
		}
	}
}

func (x *gieIndex) drop(h uint64, e int) {
	set := x.holders[h]
	if set == nil {
		return
	}
	set[e/64] &^= 1 << (e % 64)
	for _, w := range set {
		if w != 0 {
			return
		}
	}
	delete(x.holders, h)
}
