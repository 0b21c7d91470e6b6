package replay

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"time"
)

// traceLine is one line of a JSONL trace (docs/replay.md, "Trace format").
type traceLine struct {
	Timestamp *float64        `json:"timestamp"`
	T         *float64        `json:"t"`
	Path      string          `json:"path"`
	Body      json.RawMessage `json:"body"`
	Request   json.RawMessage `json:"request"`
}

// ReadTraceFile reads a JSONL trace file; see ReadTrace.
func ReadTraceFile(path string, spec Spec) (*Workload, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	w, err := ReadTrace(f, spec)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return w, nil
}

// ReadTrace reads a JSONL trace: one object per line,
//
//	{"timestamp": 12.5, "path": "/v1/chat/completions", "body": {...OpenAI request...}}
//
// "t" is accepted for "timestamp" and "request" for "body"; the body may also be a JSON string
// holding the request. Timestamps are seconds (float), relative or absolute (Unix): the earliest
// becomes time zero and requests are replayed in timestamp order. "path" defaults to
// /v1/chat/completions when the body has "messages" and /v1/completions when it has "prompt".
// Blank lines are skipped. spec.Requests > 0 keeps the first that many requests; spec.Rate > 0
// rescales the timestamps to that mean rate; spec.ErrorRate injects failures as for generated
// workloads.
func ReadTrace(r io.Reader, spec Spec) (*Workload, error) {
	if spec.Engine.Model == "" {
		spec.Engine = EngineConfig()
	}
	type entry struct {
		ts   float64
		line int
		req  Request
	}
	var entries []entry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		req, ts, err := parseTraceLine(b)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		entries = append(entries, entry{ts: ts, line: line, req: req})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", line+1, err)
	}
	if len(entries) == 0 {
		return nil, errors.New("the trace has no requests")
	}
	sort.SliceStable(entries, func(i, j int) bool { return entries[i].ts < entries[j].ts })
	if spec.Requests > 0 && spec.Requests < len(entries) {
		entries = entries[:spec.Requests]
	}
	t0 := entries[0].ts
	span := entries[len(entries)-1].ts - t0
	scale := 1.0
	rate := 0.0
	if span > 0 {
		rate = float64(len(entries)-1) / span
	}
	if spec.Rate > 0 && rate > 0 {
		scale = rate / spec.Rate
		rate = spec.Rate
	}
	g := &gen{spec: spec, errs: newRand(spec.Seed, "trace/errors"),
		w: &Workload{Name: "trace", About: "requests replayed from a JSONL trace at their timestamps", Rate: rate,
			Params: map[string]any{"requests": len(entries), "rate": rate, "timeScale": scale}}}
	for _, e := range entries {
		e.req.At = time.Duration((e.ts - t0) * scale * float64(time.Second))
		if err := g.addRequest(e.req); err != nil {
			return nil, fmt.Errorf("line %d: %w", e.line, err)
		}
	}
	return g.w, nil
}

func parseTraceLine(b []byte) (Request, float64, error) {
	var tl traceLine
	if err := json.Unmarshal(b, &tl); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return Request{}, 0, fmt.Errorf("not a JSON object: %v", err)
		}
		return Request{}, 0, fmt.Errorf("bad field: %v", err)
	}
	ts := tl.Timestamp
	if ts == nil {
		ts = tl.T
	}
	if ts == nil {
		return Request{}, 0, errors.New(`no "timestamp" (or "t")`)
	}
	if math.IsNaN(*ts) || math.IsInf(*ts, 0) || *ts < 0 {
		return Request{}, 0, fmt.Errorf("timestamp %v: want seconds >= 0", *ts)
	}
	body := tl.Body
	if len(body) == 0 || string(body) == "null" {
		body = tl.Request
	}
	body = bytes.TrimSpace(body)
	if len(body) == 0 || string(body) == "null" {
		return Request{}, 0, errors.New(`no "body" (or "request")`)
	}
	if body[0] == '"' {
		var s string
		if err := json.Unmarshal(body, &s); err != nil {
			return Request{}, 0, fmt.Errorf("body: %v", err)
		}
		body = []byte(s)
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(body, &probe); err != nil {
		return Request{}, 0, fmt.Errorf("body is not a JSON object: %v", err)
	}
	path := tl.Path
	if path == "" {
		switch {
		case probe["messages"] != nil:
			path = "/v1/chat/completions"
		case probe["prompt"] != nil:
			path = "/v1/completions"
		default:
			return Request{}, 0, errors.New(`no "path", and the body has neither "messages" nor "prompt"`)
		}
	}
	return Request{Path: path, Body: append([]byte(nil), body...), After: -1, Group: -1}, *ts, nil
}
