package scrape

import (
	"net/url"
	"strings"
	"time"
)

// variant is which of its requests a loop sends.
//
// Python's prometheus_client (vLLM's and SGLang's exposition) answers the query
// name[]=<name>&name[]=... with only the series of those names: ~1 KB instead of a vLLM
// page's ~50 KB, so the scraper asks for the families it reads. Servers differ in how they
// take it:
//   - a plain prometheus_client application (make_wsgi_app, start_http_server, and
//     make_asgi_app from 0.23 on) filters;
//   - make_asgi_app before 0.23 ignored the query (it looked the parameter up as a string
//     in a dict of bytes): the whole page comes back, read as usual;
//   - vLLM since 0.8 serves GET /metrics from prometheus-fastapi-instrumentator's route,
//     which ignores the query, and mounts prometheus_client's application behind it, where
//     /metrics/ (trailing slash) reaches it: variantSlash;
//   - a multiprocess registry (SGLang always; vLLM with several API server processes)
//     knows no names, so a filtered request gets an empty page: the loop falls back to the
//     whole page.
type variant int

const (
	variantFiltered variant = iota // path?name[]=...
	variantSlash                   // path/?name[]=...
	variantWhole                   // path
	numVariants
)

var variantNames = [numVariants]string{"filtered", "filtered-slash", "whole"}

func (v variant) String() string { return variantNames[v] }

// fallback is the request to send when v's answer holds none of the families.
func (v variant) fallback() variant {
	if v == variantSlash {
		return variantFiltered
	}
	return variantWhole
}

// filterRetry is how long a request that did not do its job (an answer without the families,
// or a trailing-slash path that ignores the filter too) is not sent again: a server upgraded
// or restarted meanwhile may filter now, and one more request every 5 minutes costs nothing.
const filterRetry = 5 * time.Minute

// familyQuery is the query that asks for names: name%5B%5D=vllm%3Anum_requests_waiting&...
// Brackets are percent-encoded (RFC 3986 does not allow them in a query, and strict servers
// refuse them raw); prometheus_client decodes the query with parse_qs, which undoes the
// encoding.
func familyQuery(names []string) string {
	var b strings.Builder
	for i, n := range names {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString("name%5B%5D=")
		b.WriteString(url.QueryEscape(n))
	}
	return b.String()
}

// requestPaths are the request targets of each variant ("" when the variant is not used):
// without filtering only the whole page; the trailing-slash variant only for a path that has
// neither a trailing slash nor a query of its own.
func requestPaths(path string, filter bool, names []string) [numVariants]string {
	var p [numVariants]string
	p[variantWhole] = path
	if !filter || len(names) == 0 {
		return p
	}
	q := familyQuery(names)
	if strings.Contains(path, "?") {
		p[variantFiltered] = path + "&" + q
		return p
	}
	p[variantFiltered] = path + "?" + q
	if !strings.HasSuffix(path, "/") {
		p[variantSlash] = path + "/?" + q
	}
	return p
}

// answer is what the request choice needs to know about one answer.
type answer int

const (
	answerFailed   answer = iota // no usable answer (refused, timeout, 5xx, unparsable...): nothing to learn about the request
	answerNone                   // an answer without any asked family: a page without them, or a 3xx/4xx status
	answerFiltered               // the asked families, and no other
	answerWhole                  // the asked families among others: the server ignored the filter
)

// classifyAnswer turns a scrape's outcome into an answer; status is the HTTP status of a
// resultBadStatus.
func classifyAnswer(res result, status int, rd reading) answer {
	switch {
	case res == resultBadStatus:
		// 3xx and 4xx say the request is wrong (a redirect, 400, 404); 408, 429 and 5xx are the
		// server's state, not the request's.
		if status >= 300 && status < 500 && status != 408 && status != 429 {
			return answerNone
		}
		return answerFailed
	case !res.publishes():
		return answerFailed
	case rd.engine == "":
		return answerNone
	case rd.others > 0:
		return answerWhole
	}
	return answerFiltered
}

// choice is a loop's request choice.
type choice struct {
	paths   [numVariants]string
	use     variant
	retryAt [numVariants]time.Time // a variant given up on is not sent before this
}

func newChoice(paths [numVariants]string) choice {
	c := choice{paths: paths, use: variantWhole}
	if paths[variantFiltered] != "" {
		c.use = variantFiltered
	}
	return c
}

// usable reports whether v exists and is not given up on at now.
func (c *choice) usable(v variant, now time.Time) bool {
	return c.paths[v] != "" && !now.Before(c.retryAt[v])
}

// after learns from the answer a to variant v at now. It returns the variant to send at once,
// within the same scrape, when a holds none of the families and another request may (ok
// false: none).
func (c *choice) after(v variant, a answer, now time.Time) (next variant, ok bool) {
	switch a {
	case answerFailed:
		return 0, false
	case answerNone:
		if v == variantWhole {
			return 0, false
		}
		c.retryAt[v] = now.Add(filterRetry)
		next = v.fallback()
		for next != variantWhole && !c.usable(next, now) {
			next = next.fallback()
		}
		c.use = next
		return next, true
	}
	switch {
	case v == variantWhole:
		// The filter was given up on: ask with it again once its time has come.
		if c.usable(variantFiltered, now) {
			c.use = variantFiltered
		}
	case v == variantFiltered && a == answerWhole && c.usable(variantSlash, now):
		c.use = variantSlash // try the trailing slash at the next scrape
	case v == variantSlash && a == answerWhole:
		// The trailing slash ignores the filter too: no better than the configured path.
		c.retryAt[v] = now.Add(filterRetry)
		c.use = variantFiltered
	default:
		c.use = v
	}
	return 0, false
}
