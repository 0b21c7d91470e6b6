package extproc

import "bytes"

// objectEnd finds where a JSON object that arrives in pieces ends, looking at each byte once: it
// tracks string and escape state and the depth of braces (brackets need no tracking: in valid
// JSON they nest inside or around balanced braces). It does not validate; the parser does.
type objectEnd struct {
	state uint8 // one of the objectEnd states below
	inStr bool
	esc   bool
	depth int
}

const (
	oeBefore uint8 = iota // only whitespace so far
	oeInside              // inside the top-level object
	oeClosed              // the object closed; only whitespace since
	oeOther               // not a single object: no early end can be found
)

// feed scans the next piece of the body and reports whether the body so far is one complete
// object followed by nothing but whitespace.
func (o *objectEnd) feed(p []byte) bool {
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch o.state {
		case oeBefore, oeClosed:
			switch c {
			case ' ', '\t', '\r', '\n':
				continue
			case '{':
				if o.state == oeBefore {
					o.state, o.depth = oeInside, 1
					continue
				}
			}
			o.state = oeOther
			return false
		case oeOther:
			return false
		}
		// Inside the object.
		if o.inStr {
			if o.esc {
				o.esc = false
				continue
			}
			// Skip to the next quote or backslash: strings are most of a prompt's bytes.
			j := bytes.IndexAny(p[i:], `"\`)
			if j < 0 {
				return false
			}
			i += j
			if p[i] == '\\' {
				o.esc = true
			} else {
				o.inStr = false
			}
			continue
		}
		switch c {
		case '"':
			o.inStr = true
		case '{':
			o.depth++
		case '}':
			if o.depth--; o.depth == 0 {
				o.state = oeClosed
			}
		}
	}
	return o.state == oeClosed
}
