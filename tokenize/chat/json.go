package chat

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// parseJSON decodes one JSON document into template values, keeping object key order (as
// Python's json module and vLLM's request parser do). Integers stay integers; numbers with a
// fraction or exponent become floats, as in Python.
func parseJSON(data []byte) (Value, error) { return parseJSONIn(nil, data) }

// parseJSONIn parses into arena a (nil: the heap). Unescaped strings point into data without a
// copy, so data must stay unchanged while the values are in use (one Render call).
func parseJSONIn(a *arena, data []byte) (Value, error) {
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
	v, err := p.value(0)
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

func (p *jsonParser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

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
			k, err := p.str()
			if err != nil {
				return undefined, err
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
		s, err := p.str()
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
	if len(p.b)-p.i >= len(word) && string(p.b[p.i:p.i+len(word)]) == word {
		p.i += len(word)
		return v, nil
	}
	return undefined, p.errf("invalid literal")
}

func (p *jsonParser) number() (Value, error) {
	start := p.i
	if p.b[p.i] == '-' {
		p.i++
	}
	if p.i >= len(p.b) {
		return undefined, p.errf("bad number")
	}
	if p.b[p.i] == '0' {
		p.i++
	} else if p.b[p.i] >= '1' && p.b[p.i] <= '9' {
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			p.i++
		}
	} else {
		return undefined, p.errf("bad number")
	}
	isFloat := false
	if p.i < len(p.b) && p.b[p.i] == '.' {
		isFloat = true
		p.i++
		d := p.i
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			p.i++
		}
		if p.i == d {
			return undefined, p.errf("bad number")
		}
	}
	if p.i < len(p.b) && (p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		isFloat = true
		p.i++
		if p.i < len(p.b) && (p.b[p.i] == '+' || p.b[p.i] == '-') {
			p.i++
		}
		d := p.i
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			p.i++
		}
		if p.i == d {
			return undefined, p.errf("bad number")
		}
	}
	text := string(p.b[start:p.i])
	if !isFloat {
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

// str decodes the string at p.i. Message contents are long, so it finds the closing quote
// and the backslashes with bytes.IndexByte (vectorized) and checks the runs between them
// for control bytes eight at a time; a string without escapes points into the input.
func (p *jsonParser) str() (string, error) {
	p.i++ // opening quote
	start := p.i
	b := p.b
	// Short strings (keys, roles) end before a vectorized search would pay off.
	i := start
	for end := min(i+16, len(b)); i < end && jsonPlain[b[i]]; i++ {
	}
	if i < len(b) && b[i] == '"' {
		p.i = i + 1
		if i == start {
			return "", nil
		}
		if p.a != nil {
			return unsafe.String(&b[start], i-start), nil
		}
		return string(b[start:i]), nil
	}
	q := bytes.IndexByte(b[i:], '"')
	if q < 0 {
		p.i = len(b)
		return "", p.errf("unterminated string")
	}
	q += i
	run := q
	if j := bytes.IndexByte(b[i:q], '\\'); j >= 0 {
		run = i + j
	}
	if c := ctlIndex(b[i:run]); c >= 0 {
		p.i = i + c
		return "", p.errf("control character in string")
	}
	if run == q {
		p.i = q + 1
		if q == start {
			return "", nil
		}
		if p.a != nil {
			return unsafe.String(&b[start], q-start), nil
		}
		return string(b[start:q]), nil
	}
	// Decode into the arena's string slab (appending only past its end), else a fresh buffer.
	var buf []byte
	inArena := p.a != nil && p.a.room(q-start+16)
	if inArena {
		buf = p.a.bytes
	}
	n := len(buf)
	buf = append(buf, b[start:run]...)
	p.i = run
	for {
		// b[p.i] is a backslash.
		p.i++
		if p.i >= len(b) {
			return "", p.errf("unterminated escape")
		}
		e := b[p.i]
		p.i++
		switch e {
		case '"', '\\', '/':
			buf = append(buf, e)
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			r, ok := p.hex4()
			if !ok {
				return "", p.errf("bad \\u escape")
			}
			if utf16.IsSurrogate(r) && p.i+6 <= len(b) && b[p.i] == '\\' && b[p.i+1] == 'u' {
				save := p.i
				p.i += 2
				r2, ok2 := p.hex4()
				if dec := utf16.DecodeRune(r, r2); ok2 && dec != utf8.RuneError {
					r = dec
				} else {
					p.i = save
				}
			}
			buf = utf8.AppendRune(buf, r)
		default:
			return "", p.errf("bad escape \\%c", e)
		}
		if p.i > q { // the quote was escaped: the string goes on to the next one
			j := bytes.IndexByte(b[p.i:], '"')
			if j < 0 {
				p.i = len(b)
				return "", p.errf("unterminated string")
			}
			q = p.i + j
		}
		// The plain run up to the next escape or the closing quote, copied at once.
		run = q
		if j := bytes.IndexByte(b[p.i:q], '\\'); j >= 0 {
			run = p.i + j
		}
		if c := ctlIndex(b[p.i:run]); c >= 0 {
			p.i += c
			return "", p.errf("control character in string")
		}
		buf = append(buf, b[p.i:run]...)
		p.i = run
		if run == q {
			p.i++
			if !inArena {
				return string(buf), nil
			}
			p.a.bytes = buf
			return unsafe.String(&buf[n], len(buf)-n), nil
		}
	}
}

// ctlIndex returns the index of the first control byte (below 0x20, which a JSON string
// must escape) in s, or -1.
func ctlIndex(s []byte) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	rest := s
	// A byte below 0x20 borrows into its high bit; one from 0x80 is masked out by &^ x.
	for len(rest) >= 32 {
		w, x := binary.LittleEndian.Uint64(rest), binary.LittleEndian.Uint64(rest[8:])
		y, z := binary.LittleEndian.Uint64(rest[16:]), binary.LittleEndian.Uint64(rest[24:])
		if ((w-0x20*ones)&^w|(x-0x20*ones)&^x|(y-0x20*ones)&^y|(z-0x20*ones)&^z)&highs != 0 {
			break
		}
		rest = rest[32:]
	}
	for i, c := range rest {
		if c < 0x20 {
			return len(s) - len(rest) + i
		}
	}
	return -1
}

// jsonPlain marks the bytes a JSON string holds without an escape.
var jsonPlain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func (p *jsonParser) hex4() (rune, bool) {
	if p.i+4 > len(p.b) {
		return 0, false
	}
	var r rune
	for _, c := range p.b[p.i : p.i+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	p.i += 4
	return r, true
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
