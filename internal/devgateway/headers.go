package devgateway

import (
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/kvpick/kvpick/internal/dataplane"
	"github.com/kvpick/kvpick/pkg/openai"
)

// hopByHop headers belong to one connection and are never forwarded (RFC 9110 7.6.1); Envoy
// removes them too.
var hopByHop = map[string]bool{
	"connection": true, "proxy-connection": true, "keep-alive": true, "proxy-authenticate": true,
	"proxy-authorization": true, "te": true, "trailer": true, "transfer-encoding": true, "upgrade": true,
}

// requestHeaders turns the client's headers into the proxy's view: lower-case keys, no
// hop-by-hop headers. content-length only when the client sent one (a chunked request has
// none behind Envoy either), and then the length of the body actually read.
func requestHeaders(r *http.Request, bodyLen int) []dataplane.Header {
	out := toHeaders(r.Header)
	if bodyLen > 0 && r.ContentLength >= 0 {
		out = append(out, dataplane.Header{Key: "content-length", Value: strconv.Itoa(bodyLen)})
	}
	return out
}

// responseHeaders is the upstream response's headers in the proxy's view.
func responseHeaders(h http.Header, contentLength int64) []dataplane.Header {
	out := toHeaders(h)
	if contentLength >= 0 {
		out = append(out, dataplane.Header{Key: "content-length", Value: strconv.FormatInt(contentLength, 10)})
	}
	return out
}

// toHeaders converts h, dropping hop-by-hop headers (and those the Connection header names),
// host and content-length (the callers set it from what they know).
func toHeaders(h http.Header) []dataplane.Header {
	if len(h) == 0 {
		return nil
	}
	conn := map[string]bool{}
	for _, v := range h.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			conn[strings.ToLower(strings.TrimSpace(f))] = true
		}
	}
	out := make([]dataplane.Header, 0, len(h))
	for k, vs := range h {
		lk := strings.ToLower(k)
		if hopByHop[lk] || conn[lk] || lk == "host" || lk == "content-length" {
			continue
		}
		for _, v := range vs {
			out = append(out, dataplane.Header{Key: lk, Value: v})
		}
	}
	return out
}

// copyHeaders writes the proxy's headers to the client response, pseudo headers and
// hop-by-hop headers left out.
func copyHeaders(dst http.Header, hs []dataplane.Header) {
	for _, h := range hs {
		if strings.HasPrefix(h.Key, ":") || hopByHop[h.Key] {
			continue
		}
		dst.Add(h.Key, h.Value)
	}
}

// writeTrailers sends trailers after the body (http.TrailerPrefix: they need not be announced).
func writeTrailers(w http.ResponseWriter, ts []dataplane.Header) {
	for _, t := range ts {
		w.Header().Add(http.TrailerPrefix+t.Key, t.Value)
	}
}

// writeImmediate writes the picker's ImmediateResponse as the proxy does: its status, headers
// and body, nothing upstream.
func writeImmediate(w http.ResponseWriter, im *dataplane.Immediate) {
	copyHeaders(w.Header(), im.Headers)
	if len(im.Body) > 0 || w.Header().Get("content-length") != "" {
		w.Header().Set("content-length", strconv.Itoa(len(im.Body)))
	}
	w.WriteHeader(im.Status)
	_, _ = w.Write(im.Body)
}

func errorBody(typ, code, msg string) []byte { return openai.ErrorJSON(typ, code, "", msg) }

// writeError writes the gateway's own OpenAI-style JSON error.
func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	b := errorBody(typ, code, msg)
	w.Header().Set("content-type", "application/json")
	w.Header().Set("content-length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// validHostPort: an ORIGINAL_DST destination is an IP literal and a port.
func validHostPort(s string) bool {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return false
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return false
	}
	p, err := strconv.Atoi(port)
	return err == nil && p > 0 && p <= 65535
}
