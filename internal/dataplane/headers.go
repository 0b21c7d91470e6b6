package dataplane

import (
	"fmt"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// Header is one HTTP header field. Keys are lower case; pseudo headers start with ':'.
type Header struct{ Key, Value string }

// Lookup returns the first value of key in hs.
func Lookup(hs []Header, key string) (string, bool) {
	for _, h := range hs {
		if h.Key == key {
			return h.Value, true
		}
	}
	return "", false
}

// Values returns every value of key in hs, in order.
func Values(hs []Header, key string) []string {
	var out []string
	for _, h := range hs {
		if h.Key == key {
			out = append(out, h.Value)
		}
	}
	return out
}

// toHeaderMap encodes headers the way Envoy does: raw_value by default (runtime
// send_header_raw_value), value when useValue emulates clients that use that field.
func toHeaderMap(hs []Header, useValue bool) *corev3.HeaderMap {
	m := &corev3.HeaderMap{Headers: make([]*corev3.HeaderValue, len(hs))}
	for i, h := range hs {
		if useValue {
			m.Headers[i] = &corev3.HeaderValue{Key: h.Key, Value: h.Value}
		} else {
			m.Headers[i] = &corev3.HeaderValue{Key: h.Key, RawValue: []byte(h.Value)}
		}
	}
	return m
}

func cloneHeaders(hs []Header) []Header { return append([]Header(nil), hs...) }

func removeKey(hs []Header, key string) []Header {
	out := hs[:0]
	for _, h := range hs {
		if h.Key != key {
			out = append(out, h)
		}
	}
	return out
}

// Envoy's default HeaderMutationRules (no mutation_rules configured): the routing headers may not
// be changed, x-envoy-* may not be changed, pseudo headers and host may not be removed, and pseudo
// headers may not be appended to. Such mutations are ignored (counted as rejected), not failed.
var routingHeaders = map[string]bool{"host": true, ":authority": true, ":method": true, ":scheme": true}

func validHeaderName(k string) bool {
	if k == "" {
		return false
	}
	s := k
	if s[0] == ':' {
		s = s[1:]
		if s == "" {
			return false
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

func validHeaderValue(v string) bool {
	return strings.IndexAny(v, "\x00\r\n") < 0
}

// headerValue checks one HeaderValue of a server mutation and returns the value Envoy would use.
func headerValue(hv *corev3.HeaderValue, phase string) (string, error) {
	if hv.GetValue() != "" && len(hv.GetRawValue()) > 0 {
		return "", protoErr(RuleHeaderBothValues, phase,
			"header %q has both value and raw_value set: Envoy rejects the mutation and fails the request with 500", hv.GetKey())
	}
	if hv.GetValue() != "" {
		return "", protoErr(RuleHeaderValueOnly, phase,
			"header %q is set in value only (%q): Envoy reads raw_value and sets it to the empty string (envoy issue 31555); set raw_value only",
			hv.GetKey(), hv.GetValue())
	}
	return string(hv.GetRawValue()), nil
}

// applyMutation applies a HeaderMutation to hs the way Envoy's ext_proc filter does with default
// mutation rules: removals first, then sets. Ignored mutations are reported in notes. A mutation
// Envoy would reject (failing the request) or one the project forbids is a *ProtocolError.
func applyMutation(hs []Header, m *extprocv3.HeaderMutation, phase string) ([]Header, []string, error) {
	if m == nil {
		return hs, nil, nil
	}
	var notes []string
	for _, k := range m.GetRemoveHeaders() {
		if !validHeaderName(k) {
			return nil, nil, protoErr(RuleHeaderInvalid, phase, "remove_headers has an invalid header name %q", k)
		}
		key := strings.ToLower(k)
		switch {
		case key[0] == ':' || key == "host":
			notes = append(notes, fmt.Sprintf("%s: removal of %q ignored (pseudo headers and host cannot be removed)", phase, key))
			continue
		case strings.HasPrefix(key, "x-envoy-"):
			notes = append(notes, fmt.Sprintf("%s: removal of %q ignored (x-envoy-* not allowed by default rules)", phase, key))
			continue
		}
		hs = removeKey(hs, key)
	}
	for _, sh := range m.GetSetHeaders() {
		hv := sh.GetHeader()
		if hv == nil {
			continue
		}
		val, err := headerValue(hv, phase)
		if err != nil {
			return nil, nil, err
		}
		if !validHeaderName(hv.GetKey()) || !validHeaderValue(val) {
			return nil, nil, protoErr(RuleHeaderInvalid, phase, "set_headers has an invalid header %q: %q", hv.GetKey(), val)
		}
		key := strings.ToLower(hv.GetKey())
		if key == "transfer-encoding" {
			return nil, nil, protoErr(RuleTransferEncoding, phase,
				"the server sets transfer-encoding (%q): echoing it breaks HTTP/2 streaming", val)
		}
		_, exists := Lookup(hs, key)
		var appendMode bool
		switch sh.GetAppendAction() {
		case corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD: // the zero value: the legacy append field decides
			appendMode = sh.GetAppend().GetValue()
		case corev3.HeaderValueOption_ADD_IF_ABSENT:
			if exists {
				continue
			}
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD:
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
			if !exists {
				continue
			}
		default:
			return nil, nil, protoErr(RuleHeaderInvalid, phase, "header %q has an unknown append_action %d", key, sh.GetAppendAction())
		}
		switch {
		case routingHeaders[key]:
			notes = append(notes, fmt.Sprintf("%s: mutation of %q ignored (routing headers are not mutable by default rules)", phase, key))
			continue
		case strings.HasPrefix(key, "x-envoy-"):
			notes = append(notes, fmt.Sprintf("%s: mutation of %q ignored (x-envoy-* not allowed by default rules)", phase, key))
			continue
		case key[0] == ':' && appendMode && exists:
			notes = append(notes, fmt.Sprintf("%s: append to pseudo header %q ignored", phase, key))
			continue
		case key == ":status":
			if n, err := strconv.Atoi(val); err != nil || n < 200 {
				notes = append(notes, fmt.Sprintf("%s: invalid :status %q ignored", phase, val))
				continue
			}
		}
		if appendMode {
			hs = append(hs, Header{key, val})
			continue
		}
		hs = setHeader(hs, key, val)
	}
	return hs, notes, nil
}

// setHeader replaces every value of key by val, keeping the position of the first one.
func setHeader(hs []Header, key, val string) []Header {
	out := hs[:0]
	done := false
	for _, h := range hs {
		if h.Key != key {
			out = append(out, h)
			continue
		}
		if !done {
			out = append(out, Header{key, val})
			done = true
		}
	}
	if !done {
		out = append(out, Header{key, val})
	}
	return out
}
