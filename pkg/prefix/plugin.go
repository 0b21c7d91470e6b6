// Package prefix is the prefix-cache-aware scorer: chained block hashes of the prompt's
// canonical rendering, a per-endpoint LRU index of the blocks each endpoint has served
// (committed on the response path, only for 2xx responses), short-lived pending records that
// bridge the gap between pick and response, running records of the prompts each endpoint is
// serving until their streams end (for the KV-room scorer), and the scorer that turns them into
// affinity.
package prefix

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/openai"
	"github.com/kvpick/kvpick/pkg/router"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Name is the plugin's name in config files.
const Name = "prefix-scorer"

// Params configure the plugin. config/default.yaml holds the defaults and their arithmetic.
type Params struct {
	BlockSize              int             `json:"blockSize"`
	MaxBlocksPerRequest    int             `json:"maxBlocksPerRequest"`
	LRUCapacityPerEndpoint int             `json:"lruCapacityPerEndpoint"`
	MinMatchBlocks         int             `json:"minMatchBlocks"`
	PendingTTL             config.Duration `json:"pendingTTL"`
	// CalibrateCapacity converts capacities in tokens into index blocks with the tokens per
	// byte learned from the servers' usage reports (calibrate.go); false takes
	// LRUCapacityPerEndpoint as index blocks.
	CalibrateCapacity bool `json:"calibrateCapacity"`
	// CapacityFromMetrics sizes each endpoint from the KV cache its server reports
	// (vllm:cache_config_info, sglang:max_total_num_tokens) instead of LRUCapacityPerEndpoint;
	// false pins every endpoint to the configured capacity.
	CapacityFromMetrics bool `json:"capacityFromMetrics"`
	// MaxIndexEntries bounds the index over the whole pool; when the endpoints' capacities add
	// up to more, all are scaled down alike. 0: no pool-wide bound.
	MaxIndexEntries int `json:"maxIndexEntries"`
	// EvictionEvidence trims an endpoint's entries when its server reports fewer cached tokens
	// (usage.prompt_tokens_details.cached_tokens) than the index predicted (evidence.go).
	EvictionEvidence bool `json:"evictionEvidence"`
	// LearnCapacity learns the capacity of an endpoint whose server reports no cache size from
	// the same reports: the entries left after an eviction trim bound it from above, a hit on
	// a block the index had dropped for want of room shows it too small (evidence.go).
	LearnCapacity bool `json:"learnCapacity"`
	// ReplicateHotPrefixes lets load spread a prefix that more than two endpoints' share of the
	// recent traffic starts with over as many endpoints (hot.go), instead of pulling it to the
	// few that hold it.
	ReplicateHotPrefixes bool `json:"replicateHotPrefixes"`
}

// Validate names the first bad field.
func (p Params) Validate() error {
	switch {
	case p.BlockSize < 16 || p.BlockSize > 4096:
		return fmt.Errorf("blockSize %d: want 16..4096 bytes (tiny blocks multiply index memory)", p.BlockSize)
	case p.MaxBlocksPerRequest < 1:
		return fmt.Errorf("maxBlocksPerRequest %d: want at least 1", p.MaxBlocksPerRequest)
	case p.LRUCapacityPerEndpoint < 1:
		return fmt.Errorf("lruCapacityPerEndpoint %d: want at least 1", p.LRUCapacityPerEndpoint)
	case p.LRUCapacityPerEndpoint > 1<<26:
		return fmt.Errorf("lruCapacityPerEndpoint %d: over the supported 67,108,864 blocks", p.LRUCapacityPerEndpoint)
	case p.MinMatchBlocks < 0:
		return fmt.Errorf("minMatchBlocks %d: must not be negative", p.MinMatchBlocks)
	case p.PendingTTL < 0:
		return fmt.Errorf("pendingTTL %v: must not be negative", p.PendingTTL.D())
	case p.MaxIndexEntries < 0 || p.MaxIndexEntries > maxIndexEntriesLimit:
		return fmt.Errorf("maxIndexEntries %d: want 0..%d (node numbers are 32-bit)", p.MaxIndexEntries, maxIndexEntriesLimit)
	}
	return nil
}

// maxIndexEntriesLimit keeps node numbers (uint32) far from wrapping.
const maxIndexEntriesLimit = 1 << 31

// Plugin is the prefix scorer. It prepares each request's block hashes, scores endpoints by how
// much of the prompt they likely hold, records a pending entry at pick and commits the blocks to
// the index when the response is a success.
type Plugin struct {
	p       Params
	index   *Index
	pending *pendingSet
	// running holds, from pick to stream end, the prompts of the requests each endpoint is
	// serving: the blocks they reference are the part of a new prompt that takes no free KV
	// room there (Matches.RunningBlocks). Kept only once a scorer has asked for them
	// (runningWanted), so that pipelines without one pay nothing for them.
	running       *pendingSet
	runningWanted atomic.Bool
	// owned holds, by endpoint that reports no cache size, the requests sent there that have
	// not ended, for the usage floor (usagefloor.go).
	owned   *ownedSet
	now     func() time.Time
	states  sync.Pool
	metrics *pluginMetrics
	caps    *capacities
	reuse   reuseRate
	// hot counts the traffic's shared prefixes (ReplicateHotPrefixes; nil when off).
	hot *hotPrefixes
	// ret holds the picks' predictions against the servers' prefix-cache counters
	// (retention.go).
	ret *retention
	// peers links the index to the other active replicas (peers.go).
	peers peerLink
}

var (
	_ router.Preparer          = (*Plugin)(nil)
	_ router.Scorer            = (*Plugin)(nil)
	_ router.PickObserver      = (*Plugin)(nil)
	_ router.ResponseObserver  = (*Plugin)(nil)
	_ router.UsageObserver     = (*Plugin)(nil)
	_ router.FirstByteObserver = (*Plugin)(nil)
	_ router.DoneObserver      = (*Plugin)(nil)
	_ router.MetricsObserver   = (*Plugin)(nil)
	_ router.PoolListener      = (*Plugin)(nil)
)

var stateKey = router.NewStateKey(Name)

// state is one request's prefix data, pooled.
type state struct {
	owner     *Plugin
	hasher    *Hasher
	hashes    []uint64
	lens      []int32  // matched blocks by endpoint slot, from the last Score
	committed []int32  // the part of lens that the index holds (the rest: pending records)
	pendings  []int32  // pending records sharing the prompt's prefix and still prefilling, by slot
	prefilled []int32  // the part of lens that pending records past their prefill hold, by slot
	ages      []uint32 // index tail ages by endpoint slot, from the last Score
	reuse     float64  // the pool's recent reuse rate when it was scored
	tpb       float64  // server tokens per index block when it was scored
	scored    bool
	rendered  int  // prompt bytes rendered
	truncated bool // the prompt was longer than maxBlocksPerRequest
	pending   pendingRecord
	running   pendingRecord
	ownedOn   *router.Endpoint // where owned tracks the request; nil: nowhere
	runLens   []int32          // leading blocks requests running there share, by slot (lazily, per Score)
	runDone   bool             // runLens is computed for the last Score
	resolved  bool             // committed or dropped
	peerID    uint64           // the pick's number for the peers (0: none published)
	streamed  bool             // the client asked for a stream: commit at the first byte
	served    *router.Endpoint
	// What was predicted for the picked endpoint, for the server's evidence (evidence.go).
	picked      *router.Endpoint
	predicted   int    // leading blocks the index held there (pending records excluded)
	predStamp   uint32 // the last of them: when the endpoint last used it, in commits
	pickTick    uint32 // the index's commit clock at pick (GhostHits)
	hasPredStmp bool
}

// Option sets an optional part of the plugin.
type Option func(*Plugin)

// WithLogger has the plugin log to l (at debug level: every change of an endpoint's index
// capacity); without it the plugin logs nothing.
func WithLogger(l *zap.Logger) Option {
	return func(pl *Plugin) {
		if l != nil {
			pl.caps.log = l.With(zap.String("plugin", Name))
		}
	}
}

// New returns the plugin. reg may be nil (no metrics).
func New(p Params, reg prometheus.Registerer, opts ...Option) (*Plugin, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	pl := &Plugin{
		p:       p,
		index:   NewIndex(p.LRUCapacityPerEndpoint),
		pending: newPendingSet(p.PendingTTL.D()),
		running: newPendingSet(runningTTL),
		owned:   newOwnedSet(),
		now:     time.Now,
	}
	pl.caps = newCapacities(pl.index, p)
	if p.ReplicateHotPrefixes {
		pl.hot = newHotPrefixes()
	}
	pl.ret = &retention{}
	pl.metrics = newPluginMetrics(pl, reg)
	if pl.metrics != nil {
		pl.caps.applied = pl.metrics.setCapacity
		pl.caps.floored = pl.metrics.setFloor
		pl.ret.observed = pl.metrics.setHitShares
	}
	for _, o := range opts {
		o(pl)
	}
	return pl, nil
}

// Name implements router.Plugin.
func (pl *Plugin) Name() string { return Name }

// Index exposes the index (for tests, benchmarks and metrics).
func (pl *Plugin) Index() *Index { return pl.index }

// Prepare hashes the prompt once per request and sets the request's affinity key.
func (pl *Plugin) Prepare(_ context.Context, req *router.Request) {
	if req.Body == nil {
		return
	}
	st, _ := pl.states.Get().(*state)
	if st == nil {
		st = &state{owner: pl, hasher: NewHasher(pl.p.BlockSize, pl.p.MaxBlocksPerRequest)}
	}
	st.hasher.Reset(Seed(req.Body.Model, req.Body.CacheSalt), st.hashes)
	req.Body.Render(st.hasher)
	st.hashes = st.hasher.Hashes()
	st.rendered, st.truncated = st.hasher.Written()
	st.scored, st.resolved = false, false
	st.streamed, st.served = req.Body.Stream, nil
	req.AffinityKey = st.hasher.AffinityKey()
	req.Set(stateKey, st)
}

func (pl *Plugin) state(req *router.Request) *state {
	st, _ := req.Get(stateKey).(*state)
	return st
}

// Score rates each endpoint by the fraction of the prompt's blocks it likely holds, from the
// index and from pending records. A match shorter than MinMatchBlocks scores 0: a few shared
// blocks (a chat template's preamble) say nothing about where the prompt's cache lives.
func (pl *Plugin) Score(_ context.Context, req *router.Request, eps []*router.Endpoint, scores []float64) {
	st := pl.state(req)
	if st == nil || len(st.hashes) == 0 {
		return
	}
	maxSlot := 0
	for _, e := range eps {
		maxSlot = max(maxSlot, e.Slot)
	}
	st.lens = zeroedSlots(st.lens, maxSlot+1)
	if cap(st.ages) <= maxSlot {
		st.ages = make([]uint32, maxSlot+1)
	}
	st.ages = st.ages[:maxSlot+1]
	pl.index.MatchAges(st.hashes, st.lens, st.ages)
	st.committed = append(st.committed[:0], st.lens...)
	if pl.caps.learn {
		pl.index.GhostMatch(st.hashes, st.lens)
	}
	st.pendings = zeroedSlots(st.pendings, maxSlot+1)
	st.prefilled = zeroedSlots(st.prefilled, maxSlot+1)
	minMatch := max(pl.p.MinMatchBlocks, 1)
	pl.pending.match(st.hashes, pl.now(), st.lens, st.pendings, st.prefilled, minMatch)
	st.scored, st.runDone = true, false
	total := float64(len(st.hashes))
	// A pending match draws followers to a prefill in progress only while it is the only one:
	// one follower sharing it saves a copy of the prefix elsewhere, but a prefix that several
	// requests are waiting for at once is hot, needs copies on several endpoints, and is better
	// computed on idle ones in parallel than queued behind one (the prefill scorer still sees
	// the pending match: following costs no more than computing it cold).
	inFlight := int32(0)
	for _, e := range eps {
		inFlight += st.pendings[e.Slot]
	}
	best := 0
	for i, e := range eps {
		m := int(st.lens[e.Slot])
		if m < minMatch {
			continue
		}
		best = max(best, m)
		if inFlight > 1 {
			m = int(max(st.committed[e.Slot], st.prefilled[e.Slot]))
			if m < minMatch {
				continue
			}
		}
		scores[i] = float64(m) / total
	}
	// Where no candidate holds minMatch blocks of the prompt nothing can be credited: the
	// sketch's lock is not taken for it (unshared prompts).
	if pl.hot != nil && best >= minMatch {
		if d := pl.hot.underReplicated(st.hashes, minMatch, st.lens, eps); d > 0 {
			credit := float64(d) / total
			for i, v := range scores[:len(eps)] {
				if v < credit {
					scores[i] = credit
				}
			}
			if pl.metrics != nil {
				pl.metrics.hotCredits.Inc()
			}
		}
	}
	st.reuse = pl.reuse.observe(float64(best) / total)
	st.tpb = pl.caps.tokensPerBlock()
}

// zeroedSlots returns s resized to n per-slot counters, all zero, reusing its array when it can.
func zeroedSlots(s []int32, n int) []int32 {
	if cap(s) < n {
		return make([]int32, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// Picked records the pending entry that lets followers find this prompt on ep right away.
func (pl *Plugin) Picked(req *router.Request, ep *router.Endpoint) {
	st := pl.state(req)
	if st == nil || len(st.hashes) == 0 {
		return
	}
	// What Score promised on ep (index and pending records, 0 below minMatchBlocks): for the
	// hit-ratio metrics and for the server's counters to confirm (retention.go).
	hit := 0
	if st.scored && ep.Slot < len(st.lens) {
		if m := int(st.lens[ep.Slot]); m >= max(pl.p.MinMatchBlocks, 1) {
			hit = m
		}
	}
	if st.scored && pl.metrics != nil {
		pl.metrics.observe(hit, len(st.hashes))
	}
	if pl.hot != nil {
		pl.hot.add(st.hashes, max(pl.p.MinMatchBlocks, 1))
	}
	now := pl.now()
	st.pending = pendingRecord{hashes: st.hashes, ep: ep, seq: req.PickSeq}
	pl.pending.add(&st.pending, now)
	pl.publishPick(st, ep)
	if pl.runningWanted.Load() {
		st.running = pendingRecord{hashes: st.hashes, ep: ep, seq: req.PickSeq}
		pl.running.add(&st.running, now)
	}
	pl.untrack(st) // picked again: tracked where it goes now
	if pl.tracks(ep) {
		st.ownedOn = ep
		pl.owned.add(ep, st, st.hashes, req.PickSeq, now)
	}
	pl.recordPrediction(st, ep)
	if st.scored {
		pl.ret.picked(ep, hit, len(st.hashes))
	}
}

// ResponseHeaders commits the prompt's blocks to the endpoint that served it when the status is
// 2xx and the request does not stream: its headers come with the whole answer. A stream's
// headers come when the request reaches the server, before its prefill: its blocks stay a
// pending record until its first byte (FirstByte), so that a follower sees a prefill in
// progress, not a cached prefix. Any other status commits nothing and drops the record.
func (pl *Plugin) ResponseHeaders(req *router.Request, served *router.Endpoint, status int) {
	st := pl.state(req)
	if st == nil {
		return
	}
	pl.runningOn(st, served, status >= 200 && status <= 299)
	if st.resolved {
		return
	}
	if status >= 200 && status <= 299 && st.streamed {
		st.served = served
		return
	}
	pl.resolve(st, served, status >= 200 && status <= 299)
}

// runningOn moves the request's running record to the endpoint that answered (the proxy may
// have retried on another), or drops it when the answer is an error: the request no longer
// runs anywhere.
func (pl *Plugin) runningOn(st *state, served *router.Endpoint, ok bool) {
	if !ok || served != st.ownedOn {
		// Its pick number is that of the endpoint it was picked for: not tracked elsewhere.
		pl.untrack(st)
	}
	if st.running.ep == nil || (ok && served == st.running.ep) {
		return
	}
	pl.running.remove(&st.running)
	st.running = pendingRecord{}
	if ok && served != nil {
		st.running = pendingRecord{hashes: st.hashes, ep: served}
		pl.running.add(&st.running, pl.now())
	}
}

// FirstByte commits a stream's blocks: its first token is out, the prompt is in the server's
// cache.
func (pl *Plugin) FirstByte(req *router.Request, served *router.Endpoint) {
	st := pl.state(req)
	if st == nil || st.resolved {
		return
	}
	pl.resolve(st, served, true)
}

// resolve drops the pending record and, on success, commits the prompt to served.
func (pl *Plugin) resolve(st *state, served *router.Endpoint, ok bool) {
	st.resolved = true
	pl.pending.remove(&st.pending)
	if !ok || served == nil || len(st.hashes) == 0 {
		pl.publishEnd(st, nil)
		return
	}
	pl.index.InsertIf(served.Slot, st.hashes, func() bool { return !served.Removed() })
	pl.publishEnd(st, served)
}

// Usage implements router.UsageObserver (calibrate.go, evidence.go).
func (pl *Plugin) Usage(req *router.Request, served *router.Endpoint, u openai.Usage) {
	if pl.metrics != nil {
		pl.metrics.observeUsage(u)
	}
	if st := pl.state(req); st != nil {
		pl.usage(st, served, u)
	}
}

// MetricsUpdated sizes the endpoint's share of the index from the KV cache its server reports.
// It also bounds from below the size of a cache whose server reports none (usagefloor.go).
func (pl *Plugin) MetricsUpdated(ep *router.Endpoint, m *router.Metrics) {
	pl.caps.metrics(ep, m)
	pl.usageFloor(ep, m)
	pl.ret.metrics(ep, m)
}

// Done drops whatever the request still holds and recycles its state.
func (pl *Plugin) Done(req *router.Request, _ *router.Endpoint) {
	st := pl.state(req)
	if st == nil {
		return
	}
	if !st.resolved && st.served != nil {
		// A stream answered 2xx whose body the picker never saw (the proxy's response body
		// mode is NONE, or the body was empty): the server took the request; commit now.
		pl.resolve(st, st.served, true)
	}
	pl.pending.remove(&st.pending)
	pl.running.remove(&st.running)
	pl.untrack(st)
	pl.publishEnd(st, nil) // a pick that neither committed nor failed: the stream ended first
	req.Set(stateKey, nil)
	st.pending, st.running = pendingRecord{}, pendingRecord{}
	st.picked, st.served = nil, nil
	pl.states.Put(st)
}

// EndpointsChanged frees everything the index holds for removed endpoints and re-plans the
// capacities (the pool-wide bound is shared by the endpoints there are).
func (pl *Plugin) EndpointsChanged(added, removed []*router.Endpoint) {
	pl.peers.endpointsChanged(added, removed)
	for _, e := range removed {
		pl.index.RemoveEndpoint(e.Slot)
		pl.owned.forget(e)
		pl.ret.forget(e)
	}
	pl.caps.endpoints(added, removed)
	if pl.metrics != nil {
		for _, e := range removed {
			pl.metrics.forget(e)
		}
	}
}

// PendingCount is the number of live pending records (for tests and metrics).
func (pl *Plugin) PendingCount() int { return pl.pending.len() }

// KeepRunningRecords makes the plugin keep running records from now on; a pipeline with a
// scorer that reads Matches.RunningBlocks asks for them when it is built (plugins.Build).
func (pl *Plugin) KeepRunningRecords() { pl.runningWanted.Store(true) }

// RunningCount is the number of live running records (for tests).
func (pl *Plugin) RunningCount() int { return pl.running.len() }

// runningTTL bounds how long a running record can outlive a request whose end the picker never
// saw; every stream's end (Done) removes its record long before.
const runningTTL = time.Hour

// Matches is what the prefix scorer found for one request: how many leading blocks of its prompt
// each endpoint likely holds (index and pending records, before the minMatchBlocks cut).
type Matches struct {
	st        *state
	lens      []int32
	committed []int32
	ages      []uint32
	Total     int // blocks in the prompt; 0 when the request has no scored prompt
	// Reuse is the pool's recent reuse rate: the mean, over the last few hundred scored
	// requests, of the share of the prompt the best endpoint held. It estimates how likely a
	// cached block is to be asked for again: near 0 when traffic shares nothing, so that
	// evicting costs nothing.
	Reuse float64
	// TokensPerBlock is the current estimate of the servers' tokens per index block (learned
	// from their usage reports, else the assumed 4 bytes per token): Total × TokensPerBlock
	// estimates the prompt's length in tokens.
	TokensPerBlock float64
}

// Pending reports whether ep's match rests on a pending record: the prompt's prefix is being
// computed there right now for a request picked moments ago, not yet confirmed by a response.
func (m *Matches) Pending(ep *router.Endpoint) bool {
	return ep.Slot < len(m.lens) && ep.Slot < len(m.committed) && m.lens[ep.Slot] > m.committed[ep.Slot]
}

// TailAge returns the age of ep's least recently used indexed block, in commits, or NotFull
// when ep's LRU has room: how stale the blocks are that a new prompt would push out there
// (Index.TailAges).
func (m *Matches) TailAge(ep *router.Endpoint) uint32 {
	if ep.Slot < len(m.ages) {
		return m.ages[ep.Slot]
	}
	return NotFull
}

// RunningBlocks returns the number of leading prompt blocks that requests running on ep (picked
// and not yet ended) share with this one. vLLM counts a cached block that no running request
// references as free: a prompt takes free room for every block beyond this count, even those
// the endpoint still caches. Computed once per Score, on the first call. Without
// KeepRunningRecords there are no records and it returns 0.
func (m *Matches) RunningBlocks(ep *router.Endpoint) int {
	st := m.st
	if st == nil || st.owner == nil {
		return 0
	}
	if !st.runDone {
		st.runLens = zeroedSlots(st.runLens, len(st.lens))
		st.owner.running.match(st.hashes, st.owner.now(), st.runLens, nil, nil, 0)
		st.runDone = true
	}
	if ep.Slot < len(st.runLens) {
		return int(st.runLens[ep.Slot])
	}
	return 0
}

// LearnedCacheTokens returns the size of ep's KV cache in tokens as learned from its server's
// cached_tokens reports (learnCapacity): for a server that reports no size, once a report has
// trimmed or grown the index's capacity for it, or lifted it with its pool's, that capacity
// over the share of a cache the index assumes reusable. 0 when the server reports its own size
// (Metrics.CapacityTokens is then the figure) or nothing has been learned.
func (m *Matches) LearnedCacheTokens(ep *router.Endpoint) float64 {
	if m.st == nil || m.st.owner == nil {
		return 0
	}
	return m.st.owner.caps.learnedTokens(ep)
}

// Blocks returns the number of leading prompt blocks ep likely holds.
func (m *Matches) Blocks(ep *router.Endpoint) int {
	if ep.Slot < len(m.lens) {
		return int(m.lens[ep.Slot])
	}
	return 0
}

// MatchesOf returns the prefix scorer's findings for req, for scorers that run after it and
// weigh the prefill work a choice saves. The zero Matches means the request has no scored prompt.
func MatchesOf(req *router.Request) Matches {
	st, _ := req.Get(stateKey).(*state)
	if st == nil || !st.scored {
		return Matches{}
	}
	return Matches{st: st, lens: st.lens, committed: st.committed, ages: st.ages, Total: len(st.hashes), Reuse: st.reuse, TokensPerBlock: st.tpb}
}
