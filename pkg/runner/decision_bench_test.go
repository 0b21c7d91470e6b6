package runner

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvpick/kvpick/config"
	"github.com/kvpick/kvpick/pkg/openai"
	"github.com/kvpick/kvpick/pkg/router"
)

// benchBody returns a chat body of about size bytes: a 2 KB system prompt shared by every
// conversation, then turns of conversation conv until the size is reached, then a new question.
func benchBody(conv, size int) []byte {
	return benchBodyAsking(conv, size, "and now the final question?")
}

// benchBodyAsking is benchBody with the final question q.
func benchBodyAsking(conv, size int, q string) []byte {
	var sb strings.Builder
	sb.WriteString(`{"model":"meta-llama/Llama-3.1-8B-Instruct","stream":true,"max_tokens":256,"messages":[`)
	sb.WriteString(`{"role":"system","content":"`)
	for sb.Len() < 2048 {
		sb.WriteString(`You are a helpful assistant.\nAnswer precisely and cite the \"source\" when you can. `)
	}
	sb.WriteString(`"}`)
	for turn := 0; sb.Len() < size-200; turn++ {
		fmt.Fprintf(&sb, `,{"role":"user","content":"conversation %d turn %d: `, conv, turn)
		for i := 0; i < 12 && sb.Len() < size-200; i++ {
			sb.WriteString(`tell me more about the topic we discussed, with details.\n`)
		}
		fmt.Fprintf(&sb, `"},{"role":"assistant","content":"Here is what I know about turn %d of %d."}`, turn, conv)
	}
	sb.WriteString(`,{"role":"user","content":"` + q + `"}]}`)
	return []byte(sb.String())
}

func benchPipeline(b *testing.B, endpoints int) *Picker {
	cfg := config.Default()
	// The endpoints are fake: no health probes, no metrics scrapes. Build alone starts neither
	// (Run does); the configuration says so too, so that the decisions' CPU stays theirs alone.
	cfg.Pool.HealthCheck.Interval = 0
	cfg.Pool.Metrics.RefreshInterval = 0
	for i := range endpoints {
		cfg.Pool.Endpoints = append(cfg.Pool.Endpoints, fmt.Sprintf("10.%d.%d.1:8000", i/250, i%250))
	}
	pk, err := Build(cfg, zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	return pk
}

// warm commits 4 conversations per endpoint (so the shared system prompt is on every endpoint
// and each conversation's history on one) and returns the parsed bodies.
func warm(b *testing.B, pk *Picker, endpoints, size int) {
	var body openai.Request
	for conv := range 4 * endpoints {
		if err := openai.Parse(openai.APIChatCompletions, benchBody(conv, size), &body); err != nil {
			b.Fatal(err)
		}
		req := &router.Request{API: openai.APIChatCompletions, Body: &body, Model: body.Model}
		d, err := pk.Pipeline.Schedule(context.Background(), req)
		if err != nil {
			b.Fatal(err)
		}
		// Commit conversation conv to endpoint conv % endpoints, as if the proxy had served it
		// there: the shared system prompt ends up everywhere, each history on one endpoint.
		served := pk.Pool.Snapshot()[conv%endpoints].Addr
		pk.Pipeline.ResponseHeaders(req, d.Endpoint, served, 200)
		pk.Pipeline.Done(req, d.Endpoint)
	}
}

// BenchmarkDecision measures the whole decision path the ext_proc server runs once it has the
// body: parse, render+hash, index and pending match, filters, scorers, pick, and the stream-end
// bookkeeping, against a warm index. Each iteration is a new request, as each stream is: a
// zero router.Request, a parser from a pool (the server pools them), and a body not seen
// before — conversation 7's history, held by one endpoint, with a new final question, so that
// the history matches and the last blocks are new.
func BenchmarkDecision(b *testing.B) {
	for _, size := range []int{4 << 10, 16 << 10, 64 << 10, 512 << 10} {
		for _, endpoints := range []int{8, 64, 256} {
			b.Run(fmt.Sprintf("body=%dKB/endpoints=%d", size>>10, endpoints), func(b *testing.B) {
				pk := benchPipeline(b, endpoints)
				warm(b, pk, endpoints, size)
				// Distinct bodies, cycled: as many as fit in 32 MiB (at least 8), so that no
				// body is parsed twice in a row and the big ones do not sit in a cache.
				bodies := make([][]byte, min(256, max(8, (32<<20)/size)))
				for i := range bodies {
					bodies[i] = benchBodyAsking(7, size, fmt.Sprintf("question %d: and what follows from it?", i))
				}
				parsers := sync.Pool{New: func() any { return &openai.Request{} }}
				b.SetBytes(int64(len(bodies[0])))
				b.ReportAllocs()
				b.ResetTimer()
				cpu0 := processCPU()
				defer func() { b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op") }()
				for i := range b.N {
					body := bodies[i%len(bodies)]
					req := &router.Request{API: openai.APIChatCompletions}
					parsed := parsers.Get().(*openai.Request)
					if err := openai.Parse(openai.APIChatCompletions, body, parsed); err != nil {
						b.Fatal(err)
					}
					req.Body, req.Model = parsed, parsed.Model
					d, err := pk.Pipeline.Schedule(context.Background(), req)
					if err != nil {
						b.Fatal(err)
					}
					pk.Pipeline.Done(req, d.Endpoint)
					parsed.Reset()
					parsers.Put(parsed)
				}
			})
		}
	}
}

// processCPU is the process's user and system CPU time: on a machine shared with other work,
// CPU per decision is steadier than the wall time ns/op reports (which counts waiting for a
// core). It includes the garbage collector's share.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
