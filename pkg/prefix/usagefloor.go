package prefix

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/kvpick/kvpick/pkg/router"
	"go.uber.org/zap"
)

// A server that reports no cache size still reports how much of it is in use: vLLM's
// kv_cache_usage_perc is the share of its KV blocks that running requests reference (cached
// blocks that no running request references count as free). The picker knows the prompts of
// the requests it sent there that are past their prefill, and so hold their prompt's blocks: at
// least those blocks are in use, so the cache holds at least
//
//	floor = (blocks those prompts reference) × tokens per block / usage
//
// tokens. It is a lower bound whatever else runs there: requests other picker replicas sent,
// generated tokens and prompts still in prefill only add to the usage — provided the requests
// counted do hold their blocks, which a scrape reporting fewer running requests than the picker
// counts says they do not (preempted or queued): such a scrape sets no bound. Chained hashes make
// prompts that start with different blocks share nothing, and prompts that start alike share at
// least the shorter one's common part, so the longest prompt of each group of prompts with the
// same first block is counted (a lower bound on the distinct blocks they reference). On the
// replay's small caches the bound came within 2% of every server's size after a few dozen
// scrapes (docs/benchmarks.md, "Sized by usage").
//
// The floor sizes the endpoint for the kv-fit scorer (Matches.LearnedCacheTokens) in full, and
// raises its learned index capacity to usageFloorIndexShare of it: part of a server's cache holds
// what the index never sees (generated answers, reserved decode blocks), and the trims of
// eviction evidence find the index's share below the whole (evidence.go).
const (
	// usageFloorMinUsage skips scrapes of a nearly idle cache: one request counted that the
	// server had just finished would make a bound of a small usage many times too large.
	usageFloorMinUsage = 0.05
	// usageFloorIndexShare of the floor is the least index capacity the endpoint learns.
	// Tuning seeds 1-6, capacity-x0.1: shared-prefix TTFT p90 −12% (4 seeds better, none worse)
	// at 0.7; the whole floor also −12% but multi-turn p90 worse on 4 seeds of 6; only kv-fit's
	// size (0) +6% (docs/benchmarks.md, "Sized by usage").
	usageFloorIndexShare = 0.7
)

// ownedSet keeps, by endpoint, what the floor needs of the requests this picker sent there and
// whose stream has not ended: their prompt's first block, length and pick number. Only endpoints
// that report no cache size are tracked, and only with learnCapacity on.
type ownedSet struct {
	mu      sync.Mutex
	byEp    map[*router.Endpoint]map[*state]ownedRec
	scratch sync.Pool // *[]ownedRec, for blocks
}

type ownedRec struct {
	first   uint64
	blocks  int
	seq     int64 // router.Request.PickSeq
	expires time.Time
}

func newOwnedSet() *ownedSet { return &ownedSet{byEp: map[*router.Endpoint]map[*state]ownedRec{}} }

// add tracks st's request on ep until remove, or until runningTTL has passed (a request whose
// end the picker never saw, like a running record).
func (o *ownedSet) add(ep *router.Endpoint, st *state, hashes []uint64, seq int64, now time.Time) {
	if len(hashes) == 0 || ep.Removed() {
		return
	}
	o.mu.Lock()
	m := o.byEp[ep]
	if m == nil {
		m = map[*state]ownedRec{}
		o.byEp[ep] = m
	}
	m[st] = ownedRec{first: hashes[0], blocks: len(hashes), seq: seq, expires: now.Add(runningTTL)}
	o.mu.Unlock()
}

func (o *ownedSet) remove(ep *router.Endpoint, st *state) {
	o.mu.Lock()
	if m := o.byEp[ep]; m != nil {
		delete(m, st)
		// An endpoint that left between add's check and forget: its map goes with its last
		// request.
		if len(m) == 0 && ep.Removed() {
			delete(o.byEp, ep)
		}
	}
	o.mu.Unlock()
}

func (o *ownedSet) forget(ep *router.Endpoint) {
	o.mu.Lock()
	delete(o.byEp, ep)
	o.mu.Unlock()
}

// blocks returns a lower bound on the distinct prompt blocks that ep's tracked requests past
// their prefill (pick number up to ep.PrefilledThrough) reference: the longest prompt of each
// group with the same first block. It drops the expired records it meets.
func (o *ownedSet) blocks(ep *router.Endpoint, now time.Time) (blocks, requests int) {
	through := ep.PrefilledThrough()
	buf, _ := o.scratch.Get().(*[]ownedRec)
	if buf == nil {
		buf = new([]ownedRec)
	}
	defer o.scratch.Put(buf)
	// Only the copy under the lock, which every pick and stream end to such endpoints takes;
	// the grouping after it.
	recs := (*buf)[:0]
	o.mu.Lock()
	m := o.byEp[ep]
	for st, r := range m {
		if now.After(r.expires) {
			delete(m, st)
			continue
		}
		if r.seq > 0 && r.seq <= through {
			recs = append(recs, r)
		}
	}
	o.mu.Unlock()
	*buf = recs
	slices.SortFunc(recs, func(a, b ownedRec) int { return cmp.Compare(a.first, b.first) })
	n := 0
	for i := 0; i < len(recs); {
		j, longest := i, 0
		for ; j < len(recs) && recs[j].first == recs[i].first; j++ {
			longest = max(longest, recs[j].blocks)
		}
		n += longest
		i = j
	}
	return n, len(recs)
}

// tracks reports whether the plugin tracks the requests it sends to ep for the floor.
func (pl *Plugin) tracks(ep *router.Endpoint) bool {
	if !pl.caps.learn {
		return false
	}
	m := ep.Metrics()
	return m == nil || m.CapacityTokens() <= 0
}

// untrack ends the tracking of st's request, if any.
func (pl *Plugin) untrack(st *state) {
	if st.ownedOn != nil {
		pl.owned.remove(st.ownedOn, st)
		st.ownedOn = nil
	}
}

// usageFloor bounds ep's cache size from below by the usage its scrape reported.
func (pl *Plugin) usageFloor(ep *router.Endpoint, m *router.Metrics) {
	if !pl.caps.learn || m == nil || !m.HasKVUsage || m.CapacityTokens() > 0 ||
		math.IsNaN(m.KVUsage) || m.KVUsage < usageFloorMinUsage || m.KVUsage > 1 {
		return
	}
	own, reqs := pl.owned.blocks(ep, pl.now())
	// Fewer running than the picker counts past their prefill: some of those hold no blocks
	// (preempted back to the queue, vLLM frees their blocks, or queued behind one that was), so
	// the bound would overshoot — and a floor only rises. Seen on the replay: a floor 67% above
	// the server's size, taken from 814 blocks at 1 running and 2 waiting (docs/benchmarks.md,
	// "Floors and the running count").
	if own == 0 || m.HasQueue && reqs > m.Running {
		return
	}
	// In usable tokens, the unit of learned capacities (reportedUsableShare of the cache).
	bound := float64(own) * pl.caps.tokensPerBlock() / m.KVUsage * reportedUsableShare
	if f, rose := pl.caps.floor(ep, bound); rose && pl.caps.log.Core().Enabled(zap.DebugLevel) {
		// What the floor was taken from: a floor only rises, so one that overshoots stays; the
		// scrape that raised it says why (docs/benchmarks.md, "Floors and the running count").
		pl.caps.log.Debug("prefix usage floor",
			zap.String("endpoint", ep.Addr), zap.Float64("usage_floor_tokens", math.Round(f)),
			zap.Float64("bound_tokens", math.Round(bound)), zap.Int("own_blocks", own),
			zap.Float64("kv_usage", m.KVUsage), zap.Int("waiting", m.Waiting), zap.Int("running", m.Running))
	}
}

// floor takes one scrape's bound on ep's usable cache tokens. The smaller of the last two
// bounds counts, so that one scrape that counted a request the server had just finished (its
// end not yet seen by the picker) cannot set the floor alone; a floor only rises. It returns
// the floor and whether this bound raised it.
func (c *capacities) floor(ep *router.Endpoint, bound float64) (floor float64, rose bool) {
	c.mu.Lock()
	if _, live := c.live[ep]; !live || c.reported[ep] > 0 {
		c.mu.Unlock()
		return 0, false
	}
	l := c.learningLocked(ep)
	f := min(bound, l.lastBound, c.configuredTokens()*learnMaxFactor)
	l.lastBound = bound
	changed := false
	if f > l.floor {
		l.floor, changed, rose = f, true, true
		if c.floored != nil {
			c.floored(ep, f)
		}
	}
	floor = l.floor
	// The index's share, checked on every bound: the default capacity an endpoint without
	// learned tokens follows can fall below it after the floor was set. Only a capacity below
	// it is raised: learning one at or above it would mark the endpoint learned and keep the
	// pool's learned level from lowering it.
	if idx := l.floor * usageFloorIndexShare; idx > c.currentLocked(ep, l) {
		changed = c.learnLocked(ep, func(cur, _ float64) float64 { return max(cur, idx) }) || changed
	}
	c.mu.Unlock()
	if changed {
		c.kick()
	}
	return floor, rose
}
