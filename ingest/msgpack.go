package ingest

import (
	"encoding/binary"
	"errors"
	"math"
)

// A hand-written msgpack reader over one payload: every read is bounds-checked, nothing
// is copied or allocated, and strings/bins are returned as sub-slices of the payload.
// Nesting is skipped iteratively, so a hostile payload cannot blow the stack.

var (
	errShort    = errors.New("msgpack: truncated")
	errType     = errors.New("msgpack: unexpected type")
	errOverflow = errors.New("msgpack: length exceeds payload")
)

type reader struct {
	p   []byte
	off int
	err error
}

func (r *reader) reset(p []byte) { r.p, r.off, r.err = p, 0, nil }

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
	r.off = len(r.p)
}

func (r *reader) peek() (byte, bool) {
	if r.off >= len(r.p) {
		r.fail(errShort)
		return 0, false
	}
	return r.p[r.off], true
}

func (r *reader) take(n int) []byte {
	if n < 0 || len(r.p)-r.off < n {
		r.fail(errShort)
		return nil
	}
	b := r.p[r.off : r.off+n]
	r.off += n
	return b
}

func (r *reader) u8() byte {
	b := r.take(1)
	if b == nil {
		return 0
	}
	return b[0]
}

func (r *reader) be(n int) uint64 {
	b := r.take(n)
	switch len(b) {
	case 1:
		return uint64(b[0])
	case 2:
		return uint64(binary.BigEndian.Uint16(b))
	case 4:
		return uint64(binary.BigEndian.Uint32(b))
	case 8:
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

// isNil consumes a nil if one is next.
func (r *reader) isNil() bool {
	c, ok := r.peek()
	if ok && c == 0xc0 {
		r.off++
		return true
	}
	return false
}

// length reads a container head and checks it against the bytes left (every element is
// at least one byte), so a forged count cannot make a caller loop for long.
func (r *reader) length(n uint64, perElem int) int {
	if n > uint64(len(r.p)-r.off)/uint64(perElem) {
		r.fail(errOverflow)
		return 0
	}
	return int(n)
}

// arrayLen reads an array head.
func (r *reader) arrayLen() int {
	c := r.u8()
	switch {
	case r.err != nil:
		return 0
	case c&0xf0 == 0x90:
		return r.length(uint64(c&0x0f), 1)
	case c == 0xdc:
		return r.length(r.be(2), 1)
	case c == 0xdd:
		return r.length(r.be(4), 1)
	}
	r.fail(errType)
	return 0
}

// container reads an array or map head: n elements (maps: pairs), isMap.
func (r *reader) container() (int, bool) {
	c, ok := r.peek()
	if !ok {
		return 0, false
	}
	switch {
	case c&0xf0 == 0x80:
		r.off++
		return r.length(uint64(c&0x0f), 2), true
	case c == 0xde:
		r.off++
		return r.length(r.be(2), 2), true
	case c == 0xdf:
		r.off++
		return r.length(r.be(4), 2), true
	}
	return r.arrayLen(), false
}

// str reads a str (or bin) and returns its bytes.
func (r *reader) str() []byte {
	c := r.u8()
	var n uint64
	switch {
	case r.err != nil:
		return nil
	case c&0xe0 == 0xa0:
		n = uint64(c & 0x1f)
	case c == 0xd9 || c == 0xc4:
		n = r.be(1)
	case c == 0xda || c == 0xc5:
		n = r.be(2)
	case c == 0xdb || c == 0xc6:
		n = r.be(4)
	default:
		r.fail(errType)
		return nil
	}
	if n > uint64(len(r.p)) {
		r.fail(errOverflow)
		return nil
	}
	return r.take(int(n))
}

// int reads any msgpack integer as its 64-bit pattern; neg says it was a negative int.
func (r *reader) int() (v uint64, neg bool) {
	c := r.u8()
	switch {
	case r.err != nil:
		return 0, false
	case c <= 0x7f:
		return uint64(c), false
	case c >= 0xe0:
		return uint64(int64(int8(c))), true
	}
	switch c {
	case 0xcc:
		return r.be(1), false
	case 0xcd:
		return r.be(2), false
	case 0xce:
		return r.be(4), false
	case 0xcf:
		return r.be(8), false
	case 0xd0:
		v := int64(int8(r.be(1)))
		return uint64(v), v < 0
	case 0xd1:
		v := int64(int16(r.be(2)))
		return uint64(v), v < 0
	case 0xd2:
		v := int64(int32(r.be(4)))
		return uint64(v), v < 0
	case 0xd3:
		v := int64(r.be(8))
		return uint64(v), v < 0
	}
	r.fail(errType)
	return 0, false
}

// float reads a float32/float64 (or an integer, as some encoders write whole seconds).
func (r *reader) float() float64 {
	c, ok := r.peek()
	if !ok {
		return 0
	}
	switch c {
	case 0xca:
		r.off++
		return float64(math.Float32frombits(uint32(r.be(4))))
	case 0xcb:
		r.off++
		return math.Float64frombits(r.be(8))
	}
	v, neg := r.int()
	if neg {
		return float64(int64(v))
	}
	return float64(v)
}

// skip consumes one value of any type, nested containers included, without recursion.
func (r *reader) skip() {
	for n := 1; n > 0 && r.err == nil; n-- {
		c := r.u8()
		if r.err != nil {
			return
		}
		var size uint64 // bytes to skip
		var kids uint64 // values to add
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		case c&0xf0 == 0x80:
			kids = 2 * uint64(c&0x0f)
		case c&0xf0 == 0x90:
			kids = uint64(c & 0x0f)
		case c&0xe0 == 0xa0:
			size = uint64(c & 0x1f)
		default:
			switch c {
			case 0xc4, 0xd9, 0xcc, 0xd0:
				if c == 0xc4 || c == 0xd9 {
					size = r.be(1)
				} else {
					size = 1
				}
			case 0xc5, 0xda:
				size = r.be(2)
			case 0xc6, 0xdb:
				size = r.be(4)
			case 0xcd, 0xd1:
				size = 2
			case 0xce, 0xd2, 0xca:
				size = 4
			case 0xcf, 0xd3, 0xcb:
				size = 8
			case 0xd4:
				size = 2
			case 0xd5:
				size = 3
			case 0xd6:
				size = 5
			case 0xd7:
				size = 9
			case 0xd8:
				size = 17
			case 0xc7:
				size = r.be(1) + 1
			case 0xc8:
				size = r.be(2) + 1
			case 0xc9:
				size = r.be(4) + 1
			case 0xdc:
				kids = r.be(2)
			case 0xdd:
				kids = r.be(4)
			case 0xde:
				kids = 2 * r.be(2)
			case 0xdf:
				kids = 2 * r.be(4)
			default: // 0xc1 is never used
				r.fail(errType)
				return
			}
		}
		left := uint64(len(r.p) - r.off)
		if size > left || kids > left {
			r.fail(errOverflow)
			return
		}
		r.off += int(size)
		n += int(kids)
		if uint64(n-1) > uint64(len(r.p)-r.off) {
			r.fail(errOverflow)
			return
		}
	}
}
