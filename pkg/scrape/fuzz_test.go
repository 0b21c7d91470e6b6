package scrape

import (
	"bytes"
	"testing"
)

// FuzzRead feeds arbitrary pages to the line selection and the parse: whatever the page, read
// must not panic, and what it publishes must be in range.
func FuzzRead(f *testing.F) {
	// Pages cut down to their vLLM and SGLang families and a few histogram lines: whole pages
	// (50 KB) make the fuzzer's minimisation of an interesting input take minutes.
	f.Add(compact(VLLMPage{Waiting: []int{3, 1}, Running: []int{5, 2}, KVUsage: []float64{0.5, 0.25}, NumGPUBlocks: 100,
		LoRA: []LoRASeries{{Running: "a,b", Waiting: "c", Max: 2, Time: 1e9}}}.Render()), false)
	f.Add(compact(VLLMPage{Waiting: []int{0}, Running: []int{0}, KVUsage: []float64{0}, OldNames: true}.Render()), false)
	f.Add(compact(SGLangPage(1, 2, 0.3, 4096)), false)
	f.Add([]byte("myengine_queue_depth{a=\"}\\\"\"} 4\nmyengine_active 2 123\nmyengine_kv_fraction NaN\n"), true)
	f.Add([]byte("# TYPE vllm:num_requests_waiting histogram\nvllm:num_requests_waiting 1\n# TYPE vllm:num_requests_waiting gauge\n"), false)
	f.Add([]byte("vllm:cache_config_info{block_size=\"0\",num_gpu_blocks=\"-5\"} 1\nvllm:lora_requests_info{max_lora=\"x\"} +Inf\n"), false)
	f.Add([]byte("vllm:num_requests_running\r\n  vllm:num_requests_waiting{} 1e308\n\tvllm:kv_cache_usage_perc -0\n"), false)
	f.Add([]byte("\x00\xff{{\n# TYPE \n#\nvllm:\n"), false)
	auto, custom := mustReader(f, autoCfg), mustReader(f, customCfg)
	f.Fuzz(func(t *testing.T, page []byte, useCustom bool) {
		r := auto
		if useCustom {
			r = custom
		}
		rd := r.read(page)
		if rd.result == resultUnparsable {
			return
		}
		m := rd.m
		if m.Waiting < 0 || m.Running < 0 || m.NumGPUBlocks < 0 || m.BlockSize < 0 || m.MaxLoRA < 0 ||
			!(m.KVUsage >= 0 && m.KVUsage <= 1) || (m.NumGPUBlocks > 0) != (m.BlockSize > 0) {
			t.Fatalf("out of range: %+v", m)
		}
		if !m.HasQueue && (m.Waiting != 0 || m.Running != 0) || !m.HasKVUsage && m.KVUsage != 0 {
			t.Fatalf("values without their Has flag: %+v", m)
		}
		// The same page read again gives the same answer, and so does a reader that has seen
		// no page (the parse cache and the kept shapes must not change it).
		if again := r.read(page); again.result != rd.result || !equalMetrics(again.m, m) {
			t.Fatalf("second read %v %+v, first %v %+v", again.result, again.m, rd.result, m)
		}
		cfg := autoCfg
		if useCustom {
			cfg = customCfg
		}
		if fresh := mustReader(t, cfg).read(page); fresh.result != rd.result || !equalMetrics(fresh.m, m) {
			t.Fatalf("fresh reader %v %+v, this one %v %+v", fresh.result, fresh.m, rd.result, m)
		}
	})
}

// compact keeps a page's HELP/TYPE and sample lines of its vllm: and sglang: families, but only
// the first 3 lines of each histogram.
func compact(page []byte) []byte {
	var out []byte
	buckets := 0
	for line := range bytes.Lines(page) {
		name := bytes.TrimPrefix(bytes.TrimPrefix(line, []byte("# HELP ")), []byte("# TYPE "))
		if !bytes.HasPrefix(name, []byte("vllm:")) && !bytes.HasPrefix(name, []byte("sglang:")) {
			continue
		}
		if bytes.Contains(line, []byte("_bucket{")) {
			if buckets++; buckets > 3 {
				continue
			}
		} else {
			buckets = 0
		}
		out = append(out, line...)
	}
	return out
}
