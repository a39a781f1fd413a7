package chat

import (
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"
)

// kind is the dynamic type of a template value; it mirrors the Python types a chat template
// can meet (JSON values plus Jinja's own objects).
type kind uint8

const (
	kUndefined kind = iota
	kNone
	kBool
	kInt
	kFloat
	kString
	kList  // Python list (and tuple when isTuple)
	kDict  // Python dict with insertion order
	kNS    // Jinja namespace(): a mutable dict
	kLoop  // the loop variable of a for block
	kFunc  // a global function, macro or bound method
	kCycle // loop.cycle bound method
)

// Value is one template value. Lists and dicts are shared by pointer and never mutated after
// construction (the sandbox forbids it), except namespaces.
type Value struct {
	k kind
	n int64 // bool, int; float bits
	s string
	// p is the *listVal (kList), *dictVal (kDict, kNS) or *object (kLoop, kFunc, kCycle):
	// one word instead of three keeps a Value at five words, so a (Value, error) result
	// travels in registers.
	p unsafe.Pointer
}

func (v Value) lst() *listVal { return (*listVal)(v.p) }
func (v Value) dct() *dictVal { return (*dictVal)(v.p) }
func (v Value) obj() *object  { return (*object)(v.p) }

type listVal struct {
	items   []Value
	isTuple bool
}

// dictVal keeps insertion order like a Python dict. Small dicts scan linearly; big ones get an
// index so lookups stay O(1).
type dictVal struct {
	keys  []string
	vals  []Value
	index map[string]int
	// memoH is nonzero on a message the render memo owns (immutable, shared across renders):
	// its key hash, so a loop over it needs no walk to find its bucket.
	memoH uint64
	// memoID is the bound message's identity in the memo (nonzero with memoH).
	memoID uint64
}

// object carries the less common values: loop state, callables, undefined names.
type object struct {
	loop *loopState
	fn   func(r *renderer, args []Value, kw []kwArg) (Value, error)
	name string
	self Value
	// macro: a template macro (its body may read any variable and set namespace attributes,
	// so the render memo never records through one).
	macro bool
}

type kwArg struct {
	name string
	v    Value
}

var (
	undefined = Value{k: kUndefined}
	none      = Value{k: kNone}
	vTrue     = Value{k: kBool, n: 1}
	vFalse    = Value{k: kBool}
	emptyStr  = Value{k: kString}
)

func boolVal(b bool) Value {
	if b {
		return vTrue
	}
	return vFalse
}
func intVal(i int64) Value     { return Value{k: kInt, n: i} }
func floatVal(f float64) Value { return Value{k: kFloat, n: int64(math.Float64bits(f))} }
func strVal(s string) Value    { return Value{k: kString, s: s} }
func listOf(items []Value) Value {
	return Value{k: kList, p: unsafe.Pointer(&listVal{items: items})}
}
func tupleOf(items ...Value) Value {
	return Value{k: kList, p: unsafe.Pointer(&listVal{items: items, isTuple: true})}
}
func undefinedNamed(name string) Value {
	return Value{k: kUndefined, s: name}
}

func (v Value) float() float64 { return math.Float64frombits(uint64(v.n)) }

func (v Value) isNumber() bool { return v.k == kInt || v.k == kFloat || v.k == kBool }

func (v Value) num() float64 {
	if v.k == kFloat {
		return v.float()
	}
	return float64(v.n)
}

func newDict(n int) *dictVal {
	return &dictVal{keys: make([]string, 0, n), vals: make([]Value, 0, n)}
}

func (d *dictVal) find(k string) int {
	if d.index != nil {
		if i, ok := d.index[k]; ok {
			return i
		}
		return -1
	}
	for i, kk := range d.keys {
		if kk == k {
			return i
		}
	}
	return -1
}

func (d *dictVal) get(k string) (Value, bool) {
	if i := d.find(k); i >= 0 {
		return d.vals[i], true
	}
	return undefined, false
}

// set keeps the first position of a key and replaces its value, as Python's dict does.
func (d *dictVal) set(k string, v Value) {
	if i := d.find(k); i >= 0 {
		d.vals[i] = v
		return
	}
	d.keys = append(d.keys, k)
	d.vals = append(d.vals, v)
	if d.index != nil {
		d.index[k] = len(d.keys) - 1
	} else if len(d.keys) > 16 {
		d.index = make(map[string]int, len(d.keys)*2)
		for i, kk := range d.keys {
			d.index[kk] = i
		}
	}
}

func (d *dictVal) del(k string) {
	i := d.find(k)
	if i < 0 {
		return
	}
	d.keys = append(d.keys[:i:i], d.keys[i+1:]...)
	d.vals = append(d.vals[:i:i], d.vals[i+1:]...)
	if d.index != nil {
		d.index = make(map[string]int, len(d.keys)*2)
		for j, kk := range d.keys {
			d.index[kk] = j
		}
	}
}

func dictValue(d *dictVal) Value { return Value{k: kDict, p: unsafe.Pointer(d)} }

// truth is Python truthiness.
func (v Value) truth() bool {
	switch v.k {
	case kUndefined, kNone:
		return false
	case kBool, kInt:
		return v.n != 0
	case kFloat:
		return v.float() != 0
	case kString:
		return v.s != ""
	case kList:
		return len(v.lst().items) > 0
	case kDict:
		return len(v.dct().keys) > 0
	}
	return true
}

func (v Value) typeName() string {
	switch v.k {
	case kUndefined:
		return "Undefined"
	case kNone:
		return "NoneType"
	case kBool:
		return "bool"
	case kInt:
		return "int"
	case kFloat:
		return "float"
	case kString:
		return "str"
	case kList:
		if v.lst().isTuple {
			return "tuple"
		}
		return "list"
	case kDict:
		return "dict"
	case kNS:
		return "Namespace"
	case kLoop:
		return "LoopContext"
	}
	return "function"
}

// appendStr appends Python's str(v), which is what {{ v }} prints.
func appendStr(dst []byte, v Value) []byte {
	switch v.k {
	case kString:
		return append(dst, v.s...)
	case kUndefined:
		return dst
	case kNone:
		return append(dst, "None"...)
	case kBool:
		if v.n != 0 {
			return append(dst, "True"...)
		}
		return append(dst, "False"...)
	case kInt:
		return strconv.AppendInt(dst, v.n, 10)
	case kFloat:
		return appendPyFloat(dst, v.float())
	}
	return appendRepr(dst, v)
}

func toStr(v Value) string {
	if v.k == kString {
		return v.s
	}
	return string(appendStr(nil, v))
}

// appendRepr appends Python's repr(v).
func appendRepr(dst []byte, v Value) []byte {
	switch v.k {
	case kString:
		return appendPyStrRepr(dst, v.s)
	case kList:
		open, close := byte('['), byte(']')
		if v.lst().isTuple {
			open, close = '(', ')'
		}
		dst = append(dst, open)
		for i, it := range v.lst().items {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			dst = appendRepr(dst, it)
		}
		if v.lst().isTuple && len(v.lst().items) == 1 {
			dst = append(dst, ',')
		}
		return append(dst, close)
	case kDict:
		dst = append(dst, '{')
		for i, k := range v.dct().keys {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			dst = appendPyStrRepr(dst, k)
			dst = append(dst, ": "...)
			dst = appendRepr(dst, v.dct().vals[i])
		}
		return append(dst, '}')
	case kNS:
		dst = append(dst, "<Namespace "...)
		dst = appendRepr(dst, dictValue(v.dct()))
		return append(dst, '>')
	case kLoop:
		return append(dst, "<LoopContext>"...)
	case kFunc, kCycle:
		return append(dst, "<function "+v.obj().name+">"...)
	}
	return appendStr(dst, v)
}

// appendPyFloat formats like Python's float.__repr__: shortest round-trip digits, scientific
// notation below 1e-4 and from 1e16 up, always a ".0" on integral values.
func appendPyFloat(dst []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(dst, "nan"...)
	case math.IsInf(f, 1):
		return append(dst, "inf"...)
	case math.IsInf(f, -1):
		return append(dst, "-inf"...)
	}
	if f == 0 {
		if math.Signbit(f) {
			return append(dst, "-0.0"...)
		}
		return append(dst, "0.0"...)
	}
	abs := math.Abs(f)
	if abs < 1e-4 || abs >= 1e16 {
		b := strconv.AppendFloat(nil, f, 'e', -1, 64)
		// Go: 1e+16, 1.5e-07 — Python uses the same two-digit minimum exponent.
		return append(dst, b...)
	}
	start := len(dst)
	dst = strconv.AppendFloat(dst, f, 'f', -1, 64)
	for _, c := range dst[start:] {
		if c == '.' {
			return dst
		}
	}
	return append(dst, ".0"...)
}

// appendPyStrRepr appends repr(s) the way CPython does: single quotes unless the text holds a
// single quote and no double quote; printable non-ASCII is kept.
func appendPyStrRepr(dst []byte, s string) []byte {
	q := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		q = '"'
	}
	dst = append(dst, q)
	for _, r := range s {
		switch {
		case r == rune(q) || r == '\\':
			dst = append(dst, '\\', byte(r))
		case r == '\n':
			dst = append(dst, '\\', 'n')
		case r == '\r':
			dst = append(dst, '\\', 'r')
		case r == '\t':
			dst = append(dst, '\\', 't')
		case r < 0x20 || r == 0x7f:
			dst = append(dst, '\\', 'x', hexDigit[r>>4], hexDigit[r&15])
		case r < 0x7f:
			dst = append(dst, byte(r))
		case !pyPrintable(r):
			switch {
			case r <= 0xff:
				dst = append(dst, '\\', 'x', hexDigit[r>>4], hexDigit[r&15])
			case r <= 0xffff:
				dst = append(dst, '\\', 'u')
				dst = appendHex(dst, uint32(r), 4)
			default:
				dst = append(dst, '\\', 'U')
				dst = appendHex(dst, uint32(r), 8)
			}
		default:
			dst = utf8.AppendRune(dst, r)
		}
	}
	return append(dst, q)
}

const hexDigit = "0123456789abcdef"

func appendHex(dst []byte, v uint32, n int) []byte {
	for i := n - 1; i >= 0; i-- {
		dst = append(dst, hexDigit[(v>>(uint(i)*4))&15])
	}
	return dst
}

// pyPrintable approximates str.isprintable for one code point: not a control, format,
// separator (other than the ASCII space) or unassigned character.
func pyPrintable(r rune) bool {
	if r == utf8.RuneError {
		return true
	}
	if r >= 0x80 && r < 0xa0 {
		return false
	}
	if r == 0xa0 || r == 0xad || r == 0x2028 || r == 0x2029 || r == 0x3000 || r == 0x1680 ||
		(r >= 0x2000 && r <= 0x200f) || r == 0x202f || r == 0x205f || (r >= 0x202a && r <= 0x202e) ||
		(r >= 0x2060 && r <= 0x206f) || r == 0xfeff || (r >= 0xd800 && r <= 0xdfff) {
		return false
	}
	return true
}

// isPySpace is Python's str.isspace for one code point (also what re's \s matches).
func isPySpace(r rune) bool {
	switch r {
	case ' ', '\t', '\n', '\v', '\f', '\r', 0x1c, 0x1d, 0x1e, 0x1f, 0x85, 0xa0, 0x1680,
		0x2028, 0x2029, 0x202f, 0x205f, 0x3000:
		return true
	}
	return r >= 0x2000 && r <= 0x200a
}

func pyStrip(s string, left, right bool) string {
	if left {
		for len(s) > 0 {
			r, n := utf8.DecodeRuneInString(s)
			if !isPySpace(r) {
				break
			}
			s = s[n:]
		}
	}
	if right {
		for len(s) > 0 {
			r, n := utf8.DecodeLastRuneInString(s)
			if !isPySpace(r) {
				break
			}
			s = s[:len(s)-n]
		}
	}
	return s
}

func pyStripChars(s, chars string, left, right bool) string {
	if left {
		for len(s) > 0 {
			r, n := utf8.DecodeRuneInString(s)
			if !strings.ContainsRune(chars, r) {
				break
			}
			s = s[n:]
		}
	}
	if right {
		for len(s) > 0 {
			r, n := utf8.DecodeLastRuneInString(s)
			if !strings.ContainsRune(chars, r) {
				break
			}
			s = s[:len(s)-n]
		}
	}
	return s
}

// runeLen is len() of a Python str.
func runeLen(s string) int {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return utf8.RuneCountInString(s)
		}
	}
	return len(s)
}
