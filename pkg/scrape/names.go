package scrape

import (
	"encoding/binary"
	"fmt"
	"strings"
	"sync"

	"github.com/kvpick/kvpick/config"
)

// field is what a metric family is read for.
type field int

const (
	fieldWaiting        field = iota // gauge, series summed
	fieldRunning                     // gauge, series summed
	fieldKVUsage                     // gauge 0..1, series averaged
	fieldCacheConfig                 // info gauge, labels block_size and num_gpu_blocks
	fieldCapacityTokens              // gauge, KV cache size in tokens, series summed
	fieldLoRA                        // gauge whose newest series (highest value) describes the adapters
	fieldFirstTokens                 // counter of first tokens (a TTFT histogram's _count), series summed
	fieldPrefixQueries               // counter of prompt tokens looked up in the prefix cache, series summed
	fieldPrefixHits                  // counter of those tokens found cached, series summed
	numFields
)

// fieldNames are the config's names of the fields, for log lines.
var fieldNames = [numFields]string{"waiting", "running", "kvUsage", "cacheConfigInfo", "capacityTokens", "loraInfo", "firstTokens", "prefixQueries", "prefixHits"}

// profile is one engine's metric names: for every field, the families that report it in order
// of preference (a newer name before the name it replaced); none when the engine does not
// report the field.
type profile struct {
	engine string
	names  [numFields][]string
}

// vLLM 0.8+ (V1 engine). kv_cache_usage_perc replaced gpu_cache_usage_perc; servers of the
// transition report both, and the newer name wins.
var vllmProfile = profile{engine: "vllm", names: [numFields][]string{
	fieldWaiting:     {"vllm:num_requests_waiting"},
	fieldRunning:     {"vllm:num_requests_running"},
	fieldKVUsage:     {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
	fieldCacheConfig: {"vllm:cache_config_info"},
	fieldLoRA:        {"vllm:lora_requests_info"},
	// The count of the time-to-first-token histogram: prefills finished, streamed or not. Only
	// the _count series is read (and, with filterFamilies, asked for).
	fieldFirstTokens: {"vllm:time_to_first_token_seconds_count"},
	// Prefix-cache lookups and hits, in tokens, counted when a request is first scheduled; the
	// gpu_ names are earlier releases' (renamed as gpu_cache_usage_perc was).
	fieldPrefixQueries: {"vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"},
	fieldPrefixHits:    {"vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"},
}}

// SGLang (--enable-metrics). Its KV cache is a token pool: max_total_num_tokens is its size.
var sglangProfile = profile{engine: "sglang", names: [numFields][]string{
	fieldWaiting:        {"sglang:num_queue_reqs"},
	fieldRunning:        {"sglang:num_running_reqs"},
	fieldKVUsage:        {"sglang:token_usage"},
	fieldCapacityTokens: {"sglang:max_total_num_tokens"},
	fieldFirstTokens:    {"sglang:time_to_first_token_seconds_count"},
}}

func customProfile(n config.MetricNames) profile {
	one := func(s string) []string {
		if s == "" {
			return nil
		}
		return []string{s}
	}
	return profile{engine: "custom", names: [numFields][]string{
		fieldWaiting:        one(n.Waiting),
		fieldRunning:        one(n.Running),
		fieldKVUsage:        one(n.KVUsage),
		fieldCacheConfig:    one(n.CacheConfigInfo),
		fieldCapacityTokens: one(n.CapacityTokens),
		fieldLoRA:           one(n.LoRAInfo),
		fieldFirstTokens:    one(n.FirstTokens),
		fieldPrefixQueries:  one(n.PrefixQueries),
		fieldPrefixHits:     one(n.PrefixHits),
	}}
}

// schema is the set of metric families a scraper reads, shared by every endpoint's reader.
// auto mode reads the vLLM and SGLang families together and decides per scrape which engine
// answered: a line that no profile wants costs the same whether one or two profiles are read.
type schema struct {
	profiles []profile
	families []family
	byName   map[string]int  // family name → index in families
	parents  map[string]bool // histogram or summary families whose series (name_count) are read
	// profFams[p][f] are the indexes of profile p's families for field f, preferred first.
	profFams [][numFields][]int
	// prefixes are the first 8 bytes of every family name, in a small hash table: a line whose
	// first 8 bytes match none of them is skipped without looking further (most of a vLLM page
	// is histograms). A longer prefix would also reject SGLang's histograms (sglang:time_* vs
	// sglang:token_usage) but made the scan of a vLLM page twice as slow.
	prefixes [prefixSlots]uint64
	// prefixFilter is false when a name is shorter than 8 bytes.
	prefixFilter bool
	// newer[f] are the families a profile prefers to f for f's field.
	newer [][]int
	cache parseCache
}

type family struct {
	name string
	kind field
}

func newSchema(cfg config.ModelServerMetrics) (*schema, error) {
	var profs []profile
	switch cfg.Engine {
	case "auto", "":
		profs = []profile{vllmProfile, sglangProfile}
	case "vllm":
		profs = []profile{vllmProfile}
	case "sglang":
		profs = []profile{sglangProfile}
	case "custom":
		profs = []profile{customProfile(cfg.Names)}
	default:
		return nil, fmt.Errorf("pool.metrics.engine %q: unknown", cfg.Engine)
	}
	s := &schema{profiles: profs, byName: map[string]int{}, parents: map[string]bool{}, prefixFilter: true, cache: parseCache{m: map[string]cached{}}}
	for _, p := range profs {
		var fams [numFields][]int
		for f, names := range p.names {
			for _, n := range names {
				i, ok := s.byName[n]
				if !ok {
					i = len(s.families)
					s.families = append(s.families, family{name: n, kind: field(f)})
					s.byName[n] = i
					// A series of a histogram or summary (name_count) or a counter (name_total)
					// comes under its family's TYPE line (name): not another family.
					for _, suffix := range []string{"_count", "_sum", "_bucket", "_total"} {
						if base, ok := strings.CutSuffix(n, suffix); ok {
							s.parents[base] = true
						}
					}
					if len(n) < 8 {
						s.prefixFilter = false
					} else {
						if err := s.addPrefix(binary.LittleEndian.Uint64([]byte(n[:8]))); err != nil {
							return nil, err
						}
					}
				} else if s.families[i].kind != field(f) {
					return nil, fmt.Errorf("pool.metrics.names: %q is given for both %s and %s", n, fieldNames[s.families[i].kind], fieldNames[f])
				}
				for len(s.newer) < len(s.families) {
					s.newer = append(s.newer, nil)
				}
				s.newer[i] = append(s.newer[i], fams[f]...)
				fams[f] = append(fams[f], i)
			}
		}
		s.profFams = append(s.profFams, fams)
	}
	return s, nil
}

// prefixSlots is the size of the prefix table: open addressing, at most a quarter full with
// the 64 names it accepts.
const prefixSlots = 256

func prefixSlot(p uint64) int { return int((p * 0x9E3779B97F4A7C15) >> 56) }

func (s *schema) addPrefix(p uint64) error {
	for i, n := prefixSlot(p), 0; n < prefixSlots/4; i, n = (i+1)%prefixSlots, n+1 {
		switch s.prefixes[i] {
		case p:
			return nil
		case 0:
			s.prefixes[i] = p
			return nil
		}
	}
	return fmt.Errorf("pool.metrics.names: too many metric names")
}

// hasPrefix reports whether p is the first 8 bytes of a wanted name. No name starts with 8 zero
// bytes, so 0 marks an empty slot.
func (s *schema) hasPrefix(p uint64) bool {
	for i := prefixSlot(p); ; i = (i + 1) % prefixSlots {
		switch s.prefixes[i] {
		case p:
			return p != 0
		case 0:
			return false
		}
	}
}

// parseCache maps a family's selected lines to what they say, for every endpoint of a scraper:
// parsing is the reader's largest cost, and most pages repeat lines seen before (the same
// model's servers report the same small counts; info gauges rarely change).
type parseCache struct {
	mu     sync.RWMutex
	m      map[string]cached
	shapes map[string]struct{} // value-only families' lines without their values (reader.shape)
	bytes  int                 // of the keys of both
}

type cached struct {
	v   value
	err error
}

// The cache's bounds. A family's lines are ~100-400 bytes (cache_config_info is the longest);
// lines over 4 KiB are parsed every time rather than kept, so that a server writing huge label
// values cannot fill memory. 4,096 entries and 1 MiB of keys at most; when full, the cache is
// emptied rather than kept in LRU order (refilling costs a few parses per endpoint).
const (
	maxCached      = 4096
	maxCachedBytes = 1 << 20
	maxCachedKey   = 4 << 10
)

func (c *parseCache) get(lines []byte) (cached, bool) {
	c.mu.RLock()
	v, ok := c.m[string(lines)]
	c.mu.RUnlock()
	return v, ok
}

func (c *parseCache) put(lines []byte, v cached) {
	if len(lines) > maxCachedKey {
		return
	}
	c.mu.Lock()
	c.makeRoomLocked(len(lines))
	if _, ok := c.m[string(lines)]; !ok {
		c.bytes += len(lines)
	}
	c.m[string(lines)] = v
	c.mu.Unlock()
}

// makeRoomLocked empties the cache when n more bytes would break its bounds.
func (c *parseCache) makeRoomLocked(n int) {
	if len(c.m)+len(c.shapes) >= maxCached || c.bytes+n > maxCachedBytes {
		clear(c.m)
		clear(c.shapes)
		c.bytes = 0
	}
}

func (c *parseCache) hasShape(key []byte) bool {
	c.mu.RLock()
	_, ok := c.shapes[string(key)]
	c.mu.RUnlock()
	return ok
}

func (c *parseCache) putShape(key []byte) {
	if len(key) > maxCachedKey {
		return
	}
	c.mu.Lock()
	if _, ok := c.shapes[string(key)]; !ok {
		c.makeRoomLocked(len(key))
		if c.shapes == nil {
			c.shapes = map[string]struct{}{}
		}
		c.shapes[string(key)] = struct{}{}
		c.bytes += len(key)
	}
	c.mu.Unlock()
}
