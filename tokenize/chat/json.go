package chat

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"

	"github.com/kvgate/kvgate/internal/jsonlex"
)

// parseJSON decodes one JSON document into template values, keeping object key order (as
// Python's json module and vLLM's request parser do). Integers stay integers; numbers with a
// fraction or exponent become floats, as in Python.
func parseJSON(data []byte) (Value, error) { return parseJSONIn(nil, data) }

// parseJSONIn parses into arena a (nil: the heap). Unescaped strings point into data without a
// copy, so data must stay unchanged while the values are in use (one Render call).
func parseJSONIn(a *arena, data []byte) (Value, error) { return parseJSONDepth(a, data, 0) }

// parseJSONDepth parses data as a value nested depth levels deep (the nesting bound counts
// them), so an array's element parsed on its own meets the same bound as in the array.
func parseJSONDepth(a *arena, data []byte, depth int) (Value, error) {
	p := jsonParser{b: data, a: a}
	if a != nil {
		p.keys, p.vals = a.jsonKeys[:0], a.jsonVals[:0]
		defer func() {
			clear(p.keys[:cap(p.keys)])
			clear(p.vals[:cap(p.vals)])
			a.jsonKeys, a.jsonVals = p.keys[:0], p.vals[:0]
		}()
	}
	p.ws()
	v, err := p.value(depth)
	if err != nil {
		return undefined, err
	}
	p.ws()
	if p.i != len(p.b) {
		return undefined, p.errf("unexpected data after the top-level value")
	}
	return v, nil
}

type jsonParser struct {
	b []byte
	i int
	a *arena
	// Scratch stacks for the members of the objects and arrays being parsed; each container
	// copies its own members out into exactly sized slices when it closes.
	keys []string
	vals []Value
}

const maxJSONDepth = 512

func (p *jsonParser) errf(format string, a ...any) error {
	return fmt.Errorf("chat: invalid JSON at offset %d: %s", p.i, fmt.Sprintf(format, a...))
}

// next consumes what follows an object member or array element: ',' (more follow) or
// the container's closing byte (done).
func (p *jsonParser) next(closing byte, container string) (done bool, err error) {
	p.ws()
	if p.i >= len(p.b) {
		return false, p.errf("unexpected end of %s", container)
	}
	switch p.b[p.i] {
	case ',':
		p.i++
		return false, nil
	case closing:
		p.i++
		return true, nil
	}
	return false, p.errf("expected ',' or '%c'", closing)
}

func (p *jsonParser) ws() { p.i = jsonlex.SkipWS(p.b, p.i) }

func (p *jsonParser) value(depth int) (Value, error) {
	if depth > maxJSONDepth {
		return undefined, p.errf("nested too deeply")
	}
	if p.i >= len(p.b) {
		return undefined, p.errf("unexpected end of input")
	}
	switch c := p.b[p.i]; {
	case c == '{':
		p.i++
		p.ws()
		if p.i < len(p.b) && p.b[p.i] == '}' {
			p.i++
			return dictValue(p.a.dict(0)), nil
		}
		kb, vb := len(p.keys), len(p.vals)
		for {
			p.ws()
			if p.i >= len(p.b) || p.b[p.i] != '"' {
				return undefined, p.errf("expected a string key")
			}
			end, esc, e := jsonlex.ScanPlainLax(p.b, p.i)
			k, ok := p.view(end, esc, e)
			if !ok {
				var err error
				if k, err = p.str(end, esc, e); err != nil {
					return undefined, err
				}
			}
			p.ws()
			if p.i >= len(p.b) || p.b[p.i] != ':' {
				return undefined, p.errf("expected ':'")
			}
			p.i++
			p.ws()
			v, err := p.value(depth + 1)
			if err != nil {
				return undefined, err
			}
			p.keys = append(p.keys, k)
			p.vals = append(p.vals, v)
			if done, err := p.next('}', "object"); err != nil {
				return undefined, err
			} else if done {
				d := p.a.dict(len(p.keys) - kb)
				for j := kb; j < len(p.keys); j++ {
					d.set(p.keys[j], p.vals[vb+j-kb]) // a repeated key keeps its first place, last value
				}
				clear(p.keys[kb:])
				clear(p.vals[vb:])
				p.keys, p.vals = p.keys[:kb], p.vals[:vb]
				return dictValue(d), nil
			}
		}
	case c == '[':
		p.i++
		p.ws()
		if p.i < len(p.b) && p.b[p.i] == ']' {
			p.i++
			return p.a.list(nil, false), nil
		}
		base := len(p.vals)
		for {
			p.ws()
			v, err := p.value(depth + 1)
			if err != nil {
				return undefined, err
			}
			p.vals = append(p.vals, v)
			if done, err := p.next(']', "array"); err != nil {
				return undefined, err
			} else if done {
				items := p.a.valSlice(len(p.vals) - base)
				copy(items, p.vals[base:])
				clear(p.vals[base:])
				p.vals = p.vals[:base]
				return p.a.list(items, false), nil
			}
		}
	case c == '"':
		end, esc, e := jsonlex.ScanPlainLax(p.b, p.i)
		if s, ok := p.view(end, esc, e); ok {
			return strVal(s), nil
		}
		s, err := p.str(end, esc, e)
		return strVal(s), err
	case c == 't':
		return p.lit("true", vTrue)
	case c == 'f':
		return p.lit("false", vFalse)
	case c == 'n':
		return p.lit("null", none)
	case c == 'N':
		return p.lit("NaN", floatVal(math.NaN()))
	case c == 'I':
		return p.lit("Infinity", floatVal(math.Inf(1)))
	case c == '-' || (c >= '0' && c <= '9'):
		if c == '-' && p.i+1 < len(p.b) && p.b[p.i+1] == 'I' {
			p.i++
			return p.lit("Infinity", floatVal(math.Inf(-1)))
		}
		return p.number()
	}
	return undefined, p.errf("unexpected character %q", p.b[p.i])
}

func (p *jsonParser) lit(word string, v Value) (Value, error) {
	end, e := jsonlex.Literal(p.b, p.i, word)
	if e != jsonlex.OK {
		return undefined, p.errf("invalid literal")
	}
	p.i = end
	return v, nil
}

func (p *jsonParser) number() (Value, error) {
	start := p.i
	end, isInt, e := jsonlex.ScanNumber(p.b, p.i)
	p.i = end
	if e != jsonlex.OK {
		return undefined, p.errf("bad number")
	}
	text := string(p.b[start:end])
	if isInt {
		if n, err := strconv.ParseInt(text, 10, 64); err == nil {
			return intVal(n), nil
		}
		return undefined, p.errf("integer %s does not fit in 64 bits", text)
	}
	f, err := strconv.ParseFloat(text, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return undefined, p.errf("bad number")
	}
	return floatVal(f), nil
}

// A string costs one call into jsonlex, as the containers' loop is hot: value scans it with
// jsonlex.ScanPlainLax itself, view (which inlines) takes a plain one in the arena, and str
// the rest.

// view returns the string at p.i that ScanPlainLax found plain up to end, pointing into the
// input, and moves past it; ok is false when str has to: a fault, escapes, no arena.
func (p *jsonParser) view(end int, esc bool, e jsonlex.Err) (s string, ok bool) {
	if e != jsonlex.OK || esc || p.a == nil {
		return "", false
	}
	s = unsafe.String(unsafe.SliceData(p.b[p.i+1:]), end-p.i-2)
	p.i = end
	return s, true
}

// str returns the string at p.i that ScanPlainLax scanned (to end, esc, e) and moves past it.
// A plain string is one copy of the input (no arena); escapes decode, in one pass with their
// check, past the end of the arena's string slab, and a string that outgrows the slab moves
// to a new one.
func (p *jsonParser) str(end int, esc bool, e jsonlex.Err) (string, error) {
	if e != jsonlex.OK {
		return "", p.strErr(e, end)
	}
	start := p.i + 1 // after the opening quote
	if !esc {
		p.i = end
		switch {
		case end-1 == start:
			return "", nil
		case p.a != nil:
			return unsafe.String(&p.b[start], end-1-start), nil
		}
		return string(p.b[start : end-1]), nil
	}
	var slab []byte
	if p.a != nil {
		slab = p.a.bytes
	}
	out, end, e := jsonlex.AppendEscapedLax(slab, p.b, start, end)
	if e != jsonlex.OK {
		return "", p.strErr(e, end)
	}
	p.i = end
	s := out[len(slab):]
	switch {
	case p.a == nil:
		return string(s), nil
	case cap(out) == cap(slab): // decoded in place
		p.a.bytes = out
	case p.a.room(len(s)):
		n := len(p.a.bytes)
		p.a.bytes = append(p.a.bytes, s...)
		s = p.a.bytes[n:]
	} // else over the render's budget: out is a fresh buffer, the string's own
	return unsafe.String(&s[0], len(s)), nil
}

// strErr reports the string fault kind found at offset at.
func (p *jsonParser) strErr(e jsonlex.Err, at int) error {
	p.i = at
	switch e {
	case jsonlex.Control:
		return p.errf("control character in string")
	case jsonlex.BadEscape:
		p.i = at + 2 // past the escape's letter
		return p.errf("bad escape \\%c", p.b[at+1])
	case jsonlex.BadHex:
		p.i = at + 2
		return p.errf("bad \\u escape")
	}
	return p.errf("unterminated string")
}

// jsonOpts are the json.dumps arguments transformers' tojson filter forwards.
type jsonOpts struct {
	indent      string
	hasIndent   bool
	itemSep     string
	keySep      string
	sortKeys    bool
	ensureASCII bool
}

func defaultJSONOpts() jsonOpts { return jsonOpts{itemSep: ", ", keySep: ": "} }

// appendJSON appends json.dumps(v, ...) exactly as Python writes it.
func appendJSON(dst []byte, v Value, o *jsonOpts, level int) ([]byte, error) {
	switch v.k {
	case kNone:
		return append(dst, "null"...), nil
	case kBool:
		if v.n != 0 {
			return append(dst, "true"...), nil
		}
		return append(dst, "false"...), nil
	case kInt:
		return strconv.AppendInt(dst, v.n, 10), nil
	case kFloat:
		f := v.float()
		switch {
		case math.IsNaN(f):
			return append(dst, "NaN"...), nil
		case math.IsInf(f, 1):
			return append(dst, "Infinity"...), nil
		case math.IsInf(f, -1):
			return append(dst, "-Infinity"...), nil
		}
		return appendPyFloat(dst, f), nil
	case kString:
		return appendJSONString(dst, v.s, o.ensureASCII), nil
	case kList:
		if len(v.lst().items) == 0 {
			return append(dst, "[]"...), nil
		}
		dst = append(dst, '[')
		for i, it := range v.lst().items {
			if i > 0 {
				dst = append(dst, o.itemSep...)
			}
			dst = o.newline(dst, level+1)
			var err error
			if dst, err = appendJSON(dst, it, o, level+1); err != nil {
				return dst, err
			}
		}
		dst = o.newline(dst, level)
		return append(dst, ']'), nil
	case kDict, kNS:
		d := v.dct()
		if len(d.keys) == 0 {
			return append(dst, "{}"...), nil
		}
		var order []int
		if o.sortKeys {
			order = ident(len(d.keys))
			sort.SliceStable(order, func(a, b int) bool { return d.keys[order[a]] < d.keys[order[b]] })
		}
		dst = append(dst, '{')
		for n := range d.keys {
			i := n
			if order != nil {
				i = order[n]
			}
			if n > 0 {
				dst = append(dst, o.itemSep...)
			}
			dst = o.newline(dst, level+1)
			dst = appendJSONString(dst, d.keys[i], o.ensureASCII)
			dst = append(dst, o.keySep...)
			var err error
			if dst, err = appendJSON(dst, d.vals[i], o, level+1); err != nil {
				return dst, err
			}
		}
		dst = o.newline(dst, level)
		return append(dst, '}'), nil
	}
	return dst, fmt.Errorf("Object of type %s is not JSON serializable", v.typeName())
}

func ident(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

func (o *jsonOpts) newline(dst []byte, level int) []byte {
	if !o.hasIndent {
		return dst
	}
	dst = append(dst, '\n')
	for i := 0; i < level; i++ {
		dst = append(dst, o.indent...)
	}
	return dst
}

// appendJSONString escapes like Python's json encoder: ", \, \n, \r, \t, \b, \f and other
// controls as \u00XX; non-ASCII kept unless ensure_ascii.
func appendJSONString(dst []byte, s string, ensureASCII bool) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch c {
			case '"':
				dst = append(dst, '\\', '"')
			case '\\':
				dst = append(dst, '\\', '\\')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			default:
				if c < 0x20 {
					dst = append(dst, '\\', 'u', '0', '0', hexDigit[c>>4], hexDigit[c&15])
				} else {
					dst = append(dst, c)
				}
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if !ensureASCII {
			dst = append(dst, s[i:i+n]...)
		} else if r > 0xffff {
			r1, r2 := utf16.EncodeRune(r)
			dst = append(dst, '\\', 'u')
			dst = appendHex(dst, uint32(r1), 4)
			dst = append(dst, '\\', 'u')
			dst = appendHex(dst, uint32(r2), 4)
		} else {
			dst = append(dst, '\\', 'u')
			dst = appendHex(dst, uint32(r), 4)
		}
		i += n
	}
	return append(dst, '"')
}
