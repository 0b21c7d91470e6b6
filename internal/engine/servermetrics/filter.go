package servermetrics

import (
	"bytes"
	"net/http"
	"net/url"
	"strconv"
)

// QueryNames returns the values of the query parameter name[] that Python's prometheus_client
// filters its page by, in order, without empty ones (parse_qs drops blank values); nil when
// the query names none. Both name[]=a and name%5B%5D=a are the parameter.
func QueryNames(q url.Values) []string {
	var names []string
	for _, n := range q["name[]"] {
		if n != "" {
			names = append(names, n)
		}
	}
	return names
}

// Filter returns what prometheus_client's restricted registry exposes of page for names:
// every family (a HELP and TYPE block) with only its samples whose name is in names, and no
// family without one. A name selects series, not families: a counter's samples are
// base_total (its _created series is a family of its own on the page), a histogram's
// base_bucket, base_count and base_sum. The result is a new slice.
func Filter(page []byte, names []string) []byte {
	want := make(map[string]bool, len(names))
	for _, n := range names {
		want[n] = true
	}
	var out, header, kept []byte
	flush := func() {
		if len(kept) > 0 {
			out = append(append(out, header...), kept...)
		}
		header, kept = header[:0], kept[:0]
	}
	inHeader := false
	for len(page) > 0 {
		line := page
		if i := bytes.IndexByte(page, '\n'); i >= 0 {
			line, page = page[:i+1], page[i+1:]
		} else {
			page = nil
		}
		if line[0] == '#' {
			// A HELP or TYPE line after samples starts the next family.
			if !inHeader {
				flush()
				inHeader = true
			}
			header = append(header, line...)
			if line[len(line)-1] != '\n' {
				header = append(header, '\n')
			}
			continue
		}
		inHeader = false
		if want[sampleName(line)] {
			kept = append(kept, line...)
			if line[len(line)-1] != '\n' {
				kept = append(kept, '\n')
			}
		}
	}
	flush()
	if out == nil {
		out = []byte{}
	}
	return out
}

func sampleName(line []byte) string {
	end := bytes.IndexAny(line, "{ \t\n")
	if end < 0 {
		end = len(line)
	}
	return string(line[:end])
}

// Exposition is how a server's metrics application answers a request that names series
// (name[]=...): what a scraper that asks for a few families gets back.
type Exposition string

// Expositions.
const (
	// ExpositionVLLM is vLLM since 0.8: GET /metrics is prometheus-fastapi-instrumentator's
	// route, which sends the whole page whatever the query; prometheus_client's own
	// application is mounted behind it and answers every other path under /metrics (such as
	// /metrics/) with only the named series (prometheus_client 0.23 and later).
	ExpositionVLLM Exposition = "vllm"
	// ExpositionFiltered is prometheus_client's application alone (vLLM before 0.8 with a
	// recent prometheus_client, make_wsgi_app, start_http_server): only the named series, on
	// every path.
	ExpositionFiltered Exposition = "filtered"
	// ExpositionWhole ignores the query: make_asgi_app before prometheus_client 0.23 looked
	// the parameter up as a string among bytes keys and never found it.
	ExpositionWhole Exposition = "whole"
	// ExpositionMultiprocess is prometheus_client's application over a multiprocess registry
	// (SGLang always; vLLM with several API server processes): the registry knows no names,
	// so a request that names series gets an empty page.
	ExpositionMultiprocess Exposition = "multiprocess"
)

// Expositions lists every exposition, for flag help.
func Expositions() []Exposition {
	return []Exposition{ExpositionVLLM, ExpositionFiltered, ExpositionWhole, ExpositionMultiprocess}
}

// DefaultExposition is how the servers of a flavor answer today.
func DefaultExposition(f Flavor) Exposition {
	if f == SGLang {
		return ExpositionMultiprocess
	}
	return ExpositionVLLM
}

// Answer returns what a server with exposition e sends for a GET of path (/metrics or a path
// under it) whose query names names (none: the whole page). page is the whole page; the
// result may be page itself.
func (e Exposition) Answer(page []byte, path string, names []string) []byte {
	if len(names) == 0 {
		return page
	}
	switch e {
	case ExpositionWhole:
		return page
	case ExpositionMultiprocess:
		return []byte{}
	case ExpositionVLLM:
		if path == "/metrics" {
			return page // the instrumentator's exact route
		}
	}
	return Filter(page, names)
}

// WriteAnswer answers r, a GET of /metrics or a path under it, with the part of page that a
// server with exposition e sends for r's query, in the text format.
func (e Exposition) WriteAnswer(w http.ResponseWriter, r *http.Request, page []byte) {
	body := e.Answer(page, r.URL.Path, QueryNames(r.URL.Query()))
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = w.Write(body)
}
