package scrape

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvpick/kvpick/pkg/router"
)

// maxSeriesPerFamily bounds the series of one family that a scrape considers: vLLM writes one
// per data-parallel engine (and served model), far fewer than this; a page with more is broken
// or hostile, and the rest is ignored rather than parsed every 50 ms.
const maxSeriesPerFamily = 256

// maxKeptLines bounds the selection buffers a reader keeps between pages: a family's lines are
// a few hundred bytes; a page that made them larger gets its buffers dropped after use.
const maxKeptLines = 64 << 10

// Bounds on plausible values: beyond them a value is a bug or garbage, not a measurement.
const (
	maxCount  = 1e9     // requests waiting or running on one server
	maxTokens = 1 << 40 // KV cache tokens on one server
	// Prefix-cache tokens looked up over a server's life: 2^40 (1.1e12) is ~8 months at 50,000
	// tokens/s; 2^53 is where a float64 stops counting by one, decades at any rate.
	maxCounter = 1 << 53
)

// reader turns one endpoint's metrics pages into router.Metrics; one goroutine uses it at a
// time.
//
// A page is tens of KB, mostly histograms the picker does not read: the reader first selects
// the lines of the wanted families with a byte scan (the first 8 bytes of a line decide for
// almost every line), then hands the selected lines to expfmt's text parser, unless the same
// lines were parsed before (the schema's cache, shared by every endpoint: servers of one model
// write identical lines for equal values, and cache_config_info and lora_requests_info almost
// never change), and unless a newer name of the same field was found (vLLM's transition
// releases write the KV usage under both names).
type reader struct {
	s      *schema
	parser expfmt.TextParser
	in     bytes.Reader

	sel    [][]byte // per family: this page's lines (the TYPE line and the samples)
	series []int    // per family: sample lines selected
	trunc  []bool   // per family: more than maxSeriesPerFamily series, the rest ignored
	val    []value  // per family: what this page says
	err    []error  // per family: why its lines did not parse

	misses []int     // families to parse
	joined []byte    // their lines, for one pass of the parser
	key    []byte    // a family's shape (fromShape)
	tokens [][2]int  // its value tokens
	vals   []float64 // their values
	others int       // TYPE lines of families not read: the page holds more than was asked for
}

// value is what one family says.
type value struct {
	found bool   // at least one sample
	bad   string // why the samples were rejected; "" when they are fine
	v     float64
	// cache config / capacity tokens
	tokens    int64
	blockSize int
	lora      loraInfo
}

type loraInfo struct {
	running, waiting []string
	max              int
}

// reading is the outcome of reading one page.
type reading struct {
	m         router.Metrics // without the scrape's times and pick count
	engine    string         // the profile that matched ("" when none did)
	result    result
	detail    string // for the log: what was missing, invalid or unparsable
	truncated string // families with more than maxSeriesPerFamily series
	others    int    // families on the page that the scraper does not read (TYPE lines)
}

func newReader(s *schema) *reader {
	n := len(s.families)
	return &reader{
		s:      s,
		parser: expfmt.NewTextParser(model.UTF8Validation),
		sel:    make([][]byte, n),
		series: make([]int, n),
		trunc:  make([]bool, n),
		val:    make([]value, n),
		err:    make([]error, n),
	}
}

// read interprets a metrics page. It never panics, whatever body holds.
func (r *reader) read(body []byte) reading {
	r.selectLines(body)
	r.parseSelected()
	rd := reading{others: r.others}
	for f, err := range r.err {
		if err != nil {
			rd.result = resultUnparsable
			rd.detail = r.s.families[f].name + ": " + err.Error()
			return rd
		}
	}
	for f, t := range r.trunc {
		if t {
			rd.truncated += r.s.families[f].name + " "
		}
	}

	// The engine is the profile with the most fields present (auto mode reads two).
	best, bestN := 0, 0
	for p := range r.s.profiles {
		n := 0
		for _, fams := range r.s.profFams[p] {
			for _, i := range fams {
				if r.val[i].found {
					n++
					break
				}
			}
		}
		if n > bestN {
			best, bestN = p, n
		}
	}
	if bestN > 0 {
		rd.engine = r.s.profiles[best].engine
	}
	fams := &r.s.profFams[best]

	var missing, invalid []string
	get := func(f field) (value, bool) {
		if len(fams[f]) == 0 {
			return value{}, false // the engine does not report it
		}
		var bad string
		for _, i := range fams[f] {
			v := r.val[i]
			switch {
			case v.found && v.bad == "":
				return v, true
			case v.found && bad == "":
				bad = r.s.families[i].name + ": " + v.bad
			}
		}
		if bad != "" {
			invalid = append(invalid, bad)
		} else if f <= fieldKVUsage {
			missing = append(missing, strings.Join(r.s.profiles[best].names[f], " or "))
		}
		return value{}, false
	}
	m := &rd.m
	w, okW := get(fieldWaiting)
	run, okR := get(fieldRunning)
	queueNames := len(fams[fieldWaiting]) + len(fams[fieldRunning])
	if queueNames > 0 && (okW || len(fams[fieldWaiting]) == 0) && (okR || len(fams[fieldRunning]) == 0) {
		m.HasQueue = true
		m.Waiting, m.Running = int(w.v), int(run.v)
	}
	if kv, ok := get(fieldKVUsage); ok {
		m.HasKVUsage, m.KVUsage = true, kv.v
	}
	if cc, ok := get(fieldCacheConfig); ok && cc.tokens > 0 {
		m.NumGPUBlocks, m.BlockSize = int(cc.tokens/int64(cc.blockSize)), cc.blockSize
	} else if ct, ok := get(fieldCapacityTokens); ok && ct.v >= 1 {
		m.NumGPUBlocks, m.BlockSize = int(ct.v), 1
	}
	if l, ok := get(fieldLoRA); ok {
		m.RunningLoRAs, m.WaitingLoRAs, m.MaxLoRA = l.lora.running, l.lora.waiting, l.lora.max
	}
	if ft, ok := get(fieldFirstTokens); ok {
		m.HasFirstTokens, m.FirstTokens = true, uint64(ft.v)
	}
	q, okQ := get(fieldPrefixQueries)
	h, okH := get(fieldPrefixHits)
	if okQ && okH && h.v <= q.v {
		m.HasPrefixCounters, m.PrefixQueries, m.PrefixHits = true, uint64(q.v), uint64(h.v)
	}
	switch {
	case len(invalid) > 0:
		rd.result = resultInvalid
		rd.detail = "invalid: " + strings.Join(invalid, "; ")
		if len(missing) > 0 {
			rd.detail += "; missing: " + strings.Join(missing, ", ")
		}
	case len(missing) > 0:
		rd.result = resultMissing
		rd.detail = "missing: " + strings.Join(missing, ", ")
		if bestN == 0 {
			rd.detail = "no known metric family on the page (" + r.engineNames() + ")"
		}
	}
	return rd
}

func (r *reader) engineNames() string {
	var s []string
	for _, p := range r.s.profiles {
		s = append(s, p.engine)
	}
	return "engine " + strings.Join(s, " or ")
}

var typePrefix = []byte("# TYPE ")

// selectLines copies the lines of the wanted families out of body, per family.
func (r *reader) selectLines(body []byte) {
	for i := range r.sel {
		if cap(r.sel[i]) > maxKeptLines {
			r.sel[i] = nil // a huge page once must not keep its memory for good
		}
		r.sel[i], r.series[i], r.trunc[i] = r.sel[i][:0], 0, false
	}
	if cap(r.joined) > maxKeptLines {
		r.joined = nil
	}
	r.others = 0
	for len(body) > 0 {
		var line []byte
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i+1], body[i+1:]
		} else {
			line, body = body, nil
		}
		name, isType := line, false
		switch line[0] {
		case '#':
			if !bytes.HasPrefix(line, typePrefix) {
				continue
			}
			name, isType = line[len(typePrefix):], true
		case ' ', '\t':
			name = bytes.TrimLeft(line, " \t")
		}
		if r.s.prefixFilter && (len(name) < 8 || !r.s.hasPrefix(binary.LittleEndian.Uint64(name))) {
			if isType {
				r.others++
			}
			continue
		}
		end := 0
		for end < len(name) && name[end] != '{' && name[end] != ' ' && name[end] != '\t' && name[end] != '\n' && name[end] != '\r' {
			end++
		}
		f, ok := r.s.byName[string(name[:end])]
		if !ok {
			if isType && !r.s.parents[string(name[:end])] {
				r.others++
			}
			continue
		}
		if !isType {
			if r.series[f] >= maxSeriesPerFamily {
				r.trunc[f] = true
				continue
			}
			r.series[f]++
		}
		// One "\n" ends every selected line, whatever ended it on the page ("\r\n", nothing).
		line = bytes.TrimRight(line, "\r\n")
		r.sel[f] = append(append(r.sel[f], line...), '\n')
	}
}

// parseSelected fills val and err for every family with lines on the page.
func (r *reader) parseSelected() {
	clear(r.val)
	clear(r.err)
	// First the families no newer name of theirs shadows, then the shadowed ones whose newer
	// name turned out absent or invalid.
	r.parseFamilies(func(f int) bool { return !r.shadowed(f, false) })
	r.parseFamilies(func(f int) bool { return r.shadowed(f, false) && !r.shadowed(f, true) })
}

// shadowed reports whether a newer name of f's field has lines on the page (valid: and was read
// with a valid value).
func (r *reader) shadowed(f int, valid bool) bool {
	for _, g := range r.s.newer[f] {
		if len(r.sel[g]) > 0 && (!valid || (r.err[g] == nil && r.val[g].found && r.val[g].bad == "")) {
			return true
		}
	}
	return false
}

// parseFamilies reads the families that want selects, from the cache or in one pass of
// expfmt's parser (one pass costs less than one per family); when that pass fails, each family
// is parsed alone to tell which one is broken.
func (r *reader) parseFamilies(want func(f int) bool) {
	r.misses, r.joined = r.misses[:0], r.joined[:0]
	for f := range r.s.families {
		if len(r.sel[f]) == 0 || !want(f) {
			continue
		}
		if c, ok := r.s.cache.get(r.sel[f]); ok {
			r.val[f], r.err[f] = c.v, c.err
			continue
		}
		if v, ok := r.fromShape(f); ok {
			r.val[f] = v
			continue
		}
		r.misses = append(r.misses, f)
		r.joined = append(r.joined, r.sel[f]...)
	}
	if len(r.misses) == 0 {
		return
	}
	mfs, err := r.parse(r.joined)
	for _, f := range r.misses {
		if err != nil {
			mfs, r.err[f] = r.parse(r.sel[f])
		}
		if r.err[f] == nil {
			r.val[f] = r.valueOf(f, mfs)
			r.keepShape(f, mfs)
		}
		r.s.cache.put(r.sel[f], cached{r.val[f], r.err[f]})
	}
}

// A value-only field's lines usually change in their values alone (a KV usage is a new float
// on every scrape): once expfmt has parsed a family's lines, their shape (the lines without
// the sample values) is kept, and lines of that shape are read by parsing the value tokens
// the way expfmt does, without a full parse.

// shape writes f's selected lines into r.key with every sample's value token cut off, and
// the value tokens into r.tokens (offsets into r.sel[f]). A token is what follows a sample
// line's last space or tab; ok is false when a sample line has none.
func (r *reader) shape(f int) (ok bool) {
	r.key, r.tokens = append(r.key[:0], 0), r.tokens[:0] // 0: no selected line starts with it
	lines := r.sel[f]
	for off := 0; off < len(lines); {
		end := off + bytes.IndexByte(lines[off:], '\n') // selectLines ends every line with one
		line := lines[off:end]
		if line[0] == '#' {
			r.key = append(append(r.key, line...), '\n')
		} else {
			sp := bytes.LastIndexAny(line, " \t")
			if sp < 0 {
				return false
			}
			r.key = append(append(r.key, line[:sp+1]...), '\n')
			r.tokens = append(r.tokens, [2]int{off + sp + 1, end})
		}
		off = end + 1
	}
	return true
}

// fromShape reads f from its value tokens when expfmt has parsed lines of the same shape.
func (r *reader) fromShape(f int) (value, bool) {
	kind := r.s.families[f].kind
	if !valueOnly(kind) || !r.shape(f) || !r.s.cache.hasShape(r.key) {
		return value{}, false
	}
	r.vals = r.vals[:0]
	for _, t := range r.tokens {
		x, err := parseValue(r.sel[f][t[0]:t[1]])
		if err != nil {
			return value{}, false // expfmt will say what is wrong
		}
		r.vals = append(r.vals, x)
	}
	if len(r.vals) == 0 {
		return value{}, true // a TYPE line without samples
	}
	return aggregate(kind, len(r.vals), func(i int) (float64, bool) { return r.vals[i], true }), true
}

// keepShape keeps f's shape when expfmt's parse of its lines agrees with reading their value
// tokens: every sample a gauge, counter or untyped value without a timestamp, in line order.
func (r *reader) keepShape(f int, mfs map[string]*dto.MetricFamily) {
	if !valueOnly(r.s.families[f].kind) || !r.shape(f) {
		return
	}
	var ms []*dto.Metric
	if mf := mfs[r.s.families[f].name]; mf != nil {
		ms = mf.GetMetric()
	}
	if len(ms) != len(r.tokens) {
		return
	}
	for i, t := range r.tokens {
		want, ok := sampleValue(ms[i])
		got, err := parseValue(r.sel[f][t[0]:t[1]])
		if !ok || err != nil || ms[i].TimestampMs != nil || !(got == want || (math.IsNaN(got) && math.IsNaN(want))) {
			return
		}
	}
	r.s.cache.putShape(r.key)
}

// parseValue parses a sample value as expfmt does (Go's float syntax, without hexadecimal
// exponents or digit separators).
func parseValue(b []byte) (float64, error) {
	if bytes.ContainsAny(b, "pP_") {
		return 0, errors.New("unsupported character in float")
	}
	return strconv.ParseFloat(string(b), 64)
}

func (r *reader) valueOf(f int, mfs map[string]*dto.MetricFamily) value {
	fam := r.s.families[f]
	mf := mfs[fam.name]
	if mf == nil || len(mf.GetMetric()) == 0 {
		return value{} // a TYPE line without samples
	}
	return extract(fam.kind, mf.GetMetric())
}

// parse runs expfmt's text parser over text.
func (r *reader) parse(text []byte) (mfs map[string]*dto.MetricFamily, err error) {
	defer func() {
		// expfmt is not known to panic, but a metrics page is untrusted input and a panic here
		// would take the picker down.
		if p := recover(); p != nil {
			mfs, err = nil, fmt.Errorf("parser panic: %v", p)
		}
	}()
	r.in.Reset(text)
	return r.parser.TextToMetricFamilies(&r.in)
}

// extract aggregates a family's series. Several series are several data-parallel engines (or
// served models) behind one address: their requests add up, their KV caches add up, and the
// used fraction is their mean (the engines' caches are the same size, and the server balances
// new requests across its engines, so the mean, not the fullest one, is how full the address
// is).
func extract(kind field, ms []*dto.Metric) value {
	v := value{found: true}
	switch kind {
	case fieldWaiting, fieldRunning, fieldCapacityTokens, fieldKVUsage, fieldFirstTokens, fieldPrefixQueries, fieldPrefixHits:
		return aggregate(kind, len(ms), func(i int) (float64, bool) { return sampleValue(ms[i]) })
	case fieldCacheConfig:
		for _, m := range ms {
			bs, err1 := strconv.Atoi(labelValue(m, "block_size"))
			nb, err2 := strconv.ParseInt(labelValue(m, "num_gpu_blocks"), 10, 64)
			if err1 != nil || err2 != nil || bs < 1 || bs > 1<<20 || nb < 0 || nb > maxTokens {
				v.bad = fmt.Sprintf("labels block_size=%q num_gpu_blocks=%q", labelValue(m, "block_size"), labelValue(m, "num_gpu_blocks"))
				return v
			}
			if v.blockSize == 0 || bs < v.blockSize {
				v.blockSize = bs
			}
			v.tokens += int64(bs) * nb
		}
		if v.tokens > maxTokens {
			v.bad = "implausible capacity"
		}
	case fieldLoRA:
		// vLLM sets the gauge to the time of its update and keeps a series for every
		// combination of labels it has written: the newest (highest value) is the current one.
		var newest *dto.Metric
		best := math.Inf(-1)
		for _, m := range ms {
			if x, ok := sampleValue(m); ok && x >= best {
				newest, best = m, x
			}
		}
		if newest == nil {
			v.bad = "not a gauge"
			return v
		}
		v.lora.running = adapters(labelValue(newest, "running_lora_adapters"))
		v.lora.waiting = adapters(labelValue(newest, "waiting_lora_adapters"))
		if s := labelValue(newest, "max_lora"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				v.bad = fmt.Sprintf("label max_lora=%q", s)
				return v
			}
			v.lora.max = n
		}
	}
	return v
}

// valueOnly reports whether a field is read from its samples' values alone (not their labels).
func valueOnly(kind field) bool {
	return kind == fieldWaiting || kind == fieldRunning || kind == fieldKVUsage || kind == fieldCapacityTokens ||
		kind == fieldFirstTokens || kind == fieldPrefixQueries || kind == fieldPrefixHits
}

// aggregate is what n samples of a value-only field say; sample(i) is the i-th value (false:
// not a gauge, counter or untyped sample).
func aggregate(kind field, n int, sample func(i int) (float64, bool)) value {
	v := value{found: true}
	limit := float64(maxCount)
	switch kind {
	case fieldCapacityTokens, fieldFirstTokens:
		limit = maxTokens // a counter of first tokens grows for the server's whole life
	case fieldPrefixQueries, fieldPrefixHits:
		limit = maxCounter
	}
	for i := range n {
		x, ok := sample(i)
		switch {
		case !ok:
			v.bad = "not a gauge"
			return v
		case kind == fieldKVUsage && !(x >= 0 && x <= 1+1e-6): // also NaN
			v.bad = "value " + strconv.FormatFloat(x, 'g', -1, 64) + " outside 0..1"
			return v
		case kind == fieldKVUsage:
			x = min(x, 1)
		case !(x >= 0 && x <= limit): // also NaN
			v.bad = "implausible value " + strconv.FormatFloat(x, 'g', -1, 64)
			return v
		}
		v.v += x
	}
	if kind == fieldKVUsage {
		v.v /= float64(n)
		return v
	}
	v.v = math.Round(v.v)
	if v.v > limit {
		v.bad = "implausible sum " + strconv.FormatFloat(v.v, 'g', -1, 64)
	}
	return v
}

func sampleValue(m *dto.Metric) (float64, bool) {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true
	case m.Untyped != nil:
		return m.Untyped.GetValue(), true
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	}
	return 0, false
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// adapters splits vLLM's comma-separated adapter list.
func adapters(s string) []string {
	if s == "" {
		return nil
	}
	var out []string
	for a := range strings.SplitSeq(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}
