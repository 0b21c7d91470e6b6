package config

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// FieldError is an error about one field of a configuration, named by its path in the file.
type FieldError struct {
	Path string // "pool.healthCheck.interval", "plugins[2].weight", "parameters.pendingTTL"
	Err  error
}

func (e *FieldError) Error() string { return e.Path + ": " + e.Err.Error() }

func (e *FieldError) Unwrap() error { return e.Err }

// CheckFields checks JSON text against the fields of dst's type as the configuration file is
// checked (checkFields): an unknown field or a duration that does not parse is a *FieldError
// whose path starts with path. Plugins check their parameters with it.
func CheckFields(raw json.RawMessage, dst any, path string) error {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil // not JSON: the decoder says so
	}
	return checkFields(v, reflect.TypeOf(dst), path)
}

// checkFields walks the decoded JSON v against the Go type t and reports, by its path in the
// file ("pool.healthCheck.interval", "plugins[2].weight"), the first field t does not have
// (with the known field it most resembles) or the first duration that does not parse:
// encoding/json names neither. Field names match as encoding/json matches them (exactly, else
// case-insensitively), so the check refuses nothing the decoder accepts. Type errors are left to
// the decoder, which names their path. Plugin parameters (json.RawMessage) are checked by the
// plugin.
func checkFields(v any, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == rawMessageType:
		return nil
	case t == durationType:
		b, _ := json.Marshal(v)
		var d Duration
		if err := d.UnmarshalJSON(b); err != nil {
			return &FieldError{path, err}
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		fields := jsonFields(t)
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys) // report the same field first on every run
		for _, k := range keys {
			ft, ok := lookupField(fields, k)
			if !ok {
				return unknownField(join(path, k), k, fields)
			}
			if err := checkFields(m[k], ft, join(path, k)); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		list, ok := v.([]any)
		if !ok {
			return nil
		}
		for i, x := range list {
			if err := checkFields(x, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		for k, x := range m {
			if err := checkFields(x, t.Elem(), join(path, k)); err != nil {
				return err
			}
		}
	}
	return nil
}

var (
	rawMessageType = reflect.TypeFor[json.RawMessage]()
	durationType   = reflect.TypeFor[Duration]()
)

type field struct {
	name string
	typ  reflect.Type
}

// jsonFields lists the JSON names of t's fields, embedded structs' fields included.
func jsonFields(t reflect.Type) []field {
	var out []field
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		switch {
		case name == "-" || (!f.IsExported() && !f.Anonymous):
			continue
		case f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct:
			out = append(out, jsonFields(f.Type)...)
			continue
		case name == "":
			name = f.Name
		}
		out = append(out, field{name, f.Type})
	}
	return out
}

func lookupField(fields []field, k string) (reflect.Type, bool) {
	for _, f := range fields {
		if f.name == k {
			return f.typ, true
		}
	}
	for _, f := range fields {
		if strings.EqualFold(f.name, k) {
			return f.typ, true
		}
	}
	return nil, false
}

// unknownField names the closest known field when one is close enough to be a typo (at most a
// third of its letters differ, or it shares the first word: chunkSize, chunkBytes), else lists
// them all.
func unknownField(path, k string, fields []field) error {
	lk := strings.ToLower(k)
	best, bestD := "", -1
	for _, f := range fields {
		lf := strings.ToLower(f.name)
		d := editDistance(lk, lf)
		if d > max(1, len(lf)/3) && commonPrefix(lk, lf) < 5 {
			continue
		}
		if bestD < 0 || d < bestD {
			best, bestD = f.name, d
		}
	}
	if best != "" {
		return &FieldError{path, fmt.Errorf("unknown field %q (did you mean %s?)", k, best)}
	}
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.name
	}
	return &FieldError{path, fmt.Errorf("unknown field %q (known: %s)", k, strings.Join(names, ", "))}
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
