package scrape

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvpick/kvpick/internal/engine/servermetrics"
)

// loadedPages makes vLLM pages as a loaded server writes them: waiting and running vary in
// small ranges (so that their lines repeat across scrapes and servers), the KV usage is a new
// float on every page (so that its line is always new to the reader's cache).
type loadedPages struct {
	templates [][]byte
	kvAt      [][]int // offsets of the KV usage values in each template
	rnd       *rand.Rand
}

const kvPlaceholder = "0.123456789"

func newLoadedPages(engines int, seed uint64) *loadedPages {
	lp := &loadedPages{rnd: rand.New(rand.NewPCG(seed, 1))}
	for i := range 64 {
		p := VLLMPage{NumGPUBlocks: 24000}
		for range engines {
			p.Waiting = append(p.Waiting, lp.rnd.IntN(8))
			p.Running = append(p.Running, 16+lp.rnd.IntN(48))
			p.KVUsage = append(p.KVUsage, 0.123456789)
		}
		t := p.Render()
		var at []int
		for off := 0; ; {
			j := bytes.Index(t[off:], []byte(kvPlaceholder))
			if j < 0 {
				break
			}
			at = append(at, off+j)
			off += j + len(kvPlaceholder)
		}
		if len(at) == 0 {
			panic(fmt.Sprint("no KV usage placeholder in template ", i))
		}
		lp.templates, lp.kvAt = append(lp.templates, t), append(lp.kvAt, at)
	}
	return lp
}

// filtered returns the pages as a server that honours name[] sends them for names.
func (lp *loadedPages) filtered(names []string) *loadedPages {
	out := &loadedPages{rnd: lp.rnd}
	for _, t := range lp.templates {
		f := servermetrics.Filter(t, names)
		var at []int
		for off := 0; ; {
			j := bytes.Index(f[off:], []byte(kvPlaceholder))
			if j < 0 {
				break
			}
			at = append(at, off+j)
			off += j + len(kvPlaceholder)
		}
		out.templates, out.kvAt = append(out.templates, f), append(out.kvAt, at)
	}
	return out
}

// next writes a page into dst (reused) and returns it.
func (lp *loadedPages) next(dst []byte) []byte {
	i := lp.rnd.IntN(len(lp.templates))
	dst = append(dst[:0], lp.templates[i]...)
	v := fmt.Appendf(nil, "0.%09d", lp.rnd.IntN(1e9))
	for _, at := range lp.kvAt[i] {
		copy(dst[at:], v)
	}
	return dst
}

// BenchmarkReadPage is the scraper's cost per page of a loaded server: select the wanted
// lines, read those not seen before (here: the KV usage, new on every page, through its kept
// shape), build the metrics. filtered: the page as a server that honours name[] sends it;
// uncached clears the parse cache and the shapes before every page: every family is parsed
// by expfmt.
func BenchmarkReadPage(b *testing.B) {
	for _, bc := range []struct {
		name               string
		engines            int
		filtered, uncached bool
	}{{"vllm-1-engine", 1, false, false}, {"vllm-1-engine-filtered", 1, true, false}, {"vllm-2-engines", 2, false, false},
		{"vllm-1-engine-uncached", 1, false, true}} {
		b.Run(bc.name, func(b *testing.B) {
			// 512 pages made beforehand; the cache is emptied when they come round again, so
			// that every KV usage line is new to it (the small counts are parsed again too).
			lp := newLoadedPages(bc.engines, 1)
			r := mustReader(b, autoCfg)
			if bc.filtered {
				var names []string
				for _, f := range r.s.families {
					names = append(names, f.name)
				}
				lp = lp.filtered(names)
			}
			pages := make([][]byte, 512)
			for i := range pages {
				pages[i] = lp.next(nil)
			}
			b.SetBytes(int64(len(pages[0])))
			b.ReportAllocs()
			defer cpuPerOp(b)()
			for i := 0; b.Loop(); i++ {
				if bc.uncached || i%len(pages) == 0 {
					clear(r.s.cache.m)
					clear(r.s.cache.shapes)
				}
				if rd := r.read(pages[i%len(pages)]); rd.result != resultOK {
					b.Fatal(rd.result, rd.detail)
				}
			}
		})
	}
}

// BenchmarkReadPageUnchanged is an idle server: nothing changed since the last scrape.
func BenchmarkReadPageUnchanged(b *testing.B) {
	page := newLoadedPages(1, 1).next(nil)
	r := mustReader(b, autoCfg)
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		if rd := r.read(page); rd.result != resultOK {
			b.Fatal(rd.result)
		}
	}
}

// BenchmarkSelectLines is the byte scan alone.
func BenchmarkSelectLines(b *testing.B) {
	page := newLoadedPages(1, 1).next(nil)
	r := mustReader(b, autoCfg)
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		r.selectLines(page)
	}
}

// BenchmarkExpfmtWholePage is the alternative the reader avoids: the whole page through expfmt.
func BenchmarkExpfmtWholePage(b *testing.B) {
	page := newLoadedPages(1, 1).next(nil)
	p := expfmt.NewTextParser(model.UTF8Validation)
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		mfs, err := p.TextToMetricFamilies(bytes.NewReader(page))
		if err != nil || mfs["vllm:num_requests_waiting"] == nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGunzipPage is what accepting gzip would cost per page (the transport asks for
// identity): inflating a vLLM page gzipped at the default level.
func BenchmarkGunzipPage(b *testing.B) {
	page := newLoadedPages(1, 1).next(nil)
	var z bytes.Buffer
	w := gzip.NewWriter(&z)
	_, _ = w.Write(page)
	_ = w.Close()
	r, err := gzip.NewReader(bytes.NewReader(z.Bytes()))
	if err != nil {
		b.Fatal(err)
	}
	var out bytes.Buffer
	b.ReportAllocs()
	defer cpuPerOp(b)()
	defer b.ReportMetric(float64(len(page))/float64(z.Len()), "ratio")
	for b.Loop() {
		if err := r.Reset(bytes.NewReader(z.Bytes())); err != nil {
			b.Fatal(err)
		}
		out.Reset()
		if _, err := io.Copy(&out, r); err != nil || out.Len() != len(page) {
			b.Fatal(err)
		}
	}
}
