package hashcore

import (
	"encoding/binary"
	"math/bits"
	"slices"
	"unsafe"
)

// Python pickle protocol 5, as CPython's C pickler writes it for exactly the values vLLM
// hashes with its default `sha256` algo: the block tuple
// (parent bytes, tuple(token ints), None | tuple(str...)) and the NONE_HASH seed str.
// Python's own pickle is the oracle (testdata/hash goldens).
//
// Layout facts that matter for bit parity:
//   - PROTO 5 comes first, outside any frame; everything after it, STOP included, is in
//     FRAMEs (opcode + 8-byte little-endian length). A frame is committed when, at the
//     start of saving an object, the current frame already holds >= 64 KiB; a final frame
//     shorter than 4 bytes loses its header.
//   - bytes < 256 long: SHORT_BINBYTES; str: SHORT_BINUNICODE (< 256 UTF-8 bytes) else
//     BINUNICODE; each followed by MEMOIZE, as is every non-empty tuple.
//   - ints: BININT1 (< 2^8), BININT2 (< 2^16), BININT (< 2^31), else LONG1 with 5
//     little-endian two's-complement bytes (2^31..2^32-1 need a zero sign byte).
//   - tuples of 1..3 items: items then TUPLE1/2/3; longer: MARK, items, TUPLE.
//   - the same object pickled twice is a BINGET of its memo slot: CPython shares one object
//     per 1-character Latin-1 string, so a 1-character cache salt equal to the LoRA name is
//     written as BINGET.
const (
	pkProto          = 0x80
	pkFrame          = 0x95
	pkShortBinBytes  = 'C'
	pkBinBytes       = 'B'
	pkShortBinUnicod = 0x8c
	pkBinUnicode     = 'X'
	pkMemoize        = 0x94
	pkBinGet         = 'h'
	pkBinInt1        = 'K'
	pkBinInt2        = 'M'
	pkBinInt         = 'J'
	pkLong1          = 0x8a
	pkMark           = '('
	pkTuple          = 't'
	pkTuple1         = 0x85
	pkTuple2         = 0x86
	pkTuple3         = 0x87
	pkNone           = 'N'
	pkStop           = '.'

	pkFrameHeader  = 9
	pkFrameTarget  = 64 * 1024
	pkFrameMinimum = 4
)

// pickler appends one pickle into buf. It holds the framing state and the memo count,
// nothing else, so it lives in the pooled scratch and allocates nothing.
type pickler struct {
	buf        []byte
	frameStart int // index of the open frame's header placeholder
	memo       int // next memo slot
}

func (p *pickler) begin(dst []byte) {
	p.buf = append(dst, pkProto, 5)
	p.memo = 0
	p.openFrame()
}

func (p *pickler) openFrame() {
	p.frameStart = len(p.buf)
	p.buf = append(p.buf, 0, 0, 0, 0, 0, 0, 0, 0, 0)
}

func (p *pickler) commitFrame() {
	fs := p.frameStart
	n := len(p.buf) - fs - pkFrameHeader
	if n >= pkFrameMinimum {
		p.buf[fs] = pkFrame
		binary.LittleEndian.PutUint64(p.buf[fs+1:], uint64(n))
		return
	}
	copy(p.buf[fs:], p.buf[fs+pkFrameHeader:])
	p.buf = p.buf[:len(p.buf)-pkFrameHeader]
}

// boundary is the pickler's check before saving each object.
func (p *pickler) boundary() {
	if len(p.buf)-p.frameStart-pkFrameHeader >= pkFrameTarget {
		p.commitFrame()
		p.openFrame()
	}
}

func (p *pickler) end() []byte {
	p.buf = append(p.buf, pkStop)
	p.commitFrame()
	return p.buf
}

func (p *pickler) memoize() {
	p.buf = append(p.buf, pkMemoize)
	p.memo++
}

func (p *pickler) bytes(b []byte) {
	p.boundary()
	if len(b) < 256 {
		p.buf = append(p.buf, pkShortBinBytes, byte(len(b)))
	} else {
		p.buf = append(p.buf, pkBinBytes)
		p.buf = binary.LittleEndian.AppendUint32(p.buf, uint32(len(b)))
	}
	p.buf = append(p.buf, b...)
	p.memoize()
}

// str writes s, or a BINGET of slot when sameAs >= 0 (the object was pickled before).
func (p *pickler) str(s string, sameAs int) {
	p.boundary()
	if sameAs >= 0 && sameAs < 256 {
		p.buf = append(p.buf, pkBinGet, byte(sameAs))
		return
	}
	if len(s) < 256 {
		p.buf = append(p.buf, pkShortBinUnicod, byte(len(s)))
	} else {
		p.buf = append(p.buf, pkBinUnicode)
		p.buf = binary.LittleEndian.AppendUint32(p.buf, uint32(len(s)))
	}
	p.buf = append(p.buf, s...)
	p.memoize()
}

func (p *pickler) none() {
	p.boundary()
	p.buf = append(p.buf, pkNone)
}

// tupleOpen/tupleClose bracket the items of a tuple of n >= 1 items.
func (p *pickler) tupleOpen(n int) {
	p.boundary()
	if n > 3 {
		p.buf = append(p.buf, pkMark)
	}
}

func (p *pickler) tupleClose(n int) {
	switch n {
	case 1:
		p.buf = append(p.buf, pkTuple1)
	case 2:
		p.buf = append(p.buf, pkTuple2)
	case 3:
		p.buf = append(p.buf, pkTuple3)
	default:
		p.buf = append(p.buf, pkTuple)
	}
	p.memoize()
}

// pickleIntForms is indexed by bits.Len32(v): the int is the little-endian word
// opcodes + v*mul, size bytes long (BININT1/2/BININT: v after one opcode byte; LONG1:
// after the opcode and the length byte 5, with a zero sign byte last).
var pickleIntForms = func() (f [33]struct{ ops, mul, size uint64 }) {
	for n := range f {
		switch {
		case n <= 8:
			f[n].ops, f[n].mul, f[n].size = pkBinInt1, 1<<8, 2
		case n <= 16:
			f[n].ops, f[n].mul, f[n].size = pkBinInt2, 1<<8, 3
		case n <= 31:
			f[n].ops, f[n].mul, f[n].size = pkBinInt, 1<<8, 5
		default:
			f[n].ops, f[n].mul, f[n].size = pkLong1|5<<8, 1<<16, 7
		}
	}
	return f
}()

// ints writes token ints, each preceded by the frame boundary check. When the whole run
// cannot reach the frame target, the checks are skipped and each int is one
// branch-free 8-byte store (token widths are unpredictable).
func (p *pickler) ints(tokens []uint32) {
	if len(p.buf)-p.frameStart-pkFrameHeader+7*len(tokens) < pkFrameTarget {
		pos := len(p.buf)
		p.buf = slices.Grow(p.buf, 7*len(tokens)+8)
		buf := p.buf[:cap(p.buf)]
		_ = buf[pos+7*len(tokens)+7] // one bounds check for every store below
		base := unsafe.Pointer(unsafe.SliceData(buf))
		for _, t := range tokens {
			f := &pickleIntForms[bits.Len32(t)]
			binary.LittleEndian.PutUint64((*[8]byte)(unsafe.Add(base, pos))[:], f.ops+uint64(t)*f.mul)
			pos += int(f.size)
		}
		p.buf = buf[:pos]
		return
	}
	buf := p.buf
	for _, t := range tokens {
		if len(buf)-p.frameStart-pkFrameHeader >= pkFrameTarget {
			p.buf = buf
			p.commitFrame()
			p.openFrame()
			buf = p.buf
		}
		switch {
		case t <= 0xff:
			buf = append(buf, pkBinInt1, byte(t))
		case t <= 0xffff:
			buf = append(buf, pkBinInt2, byte(t), byte(t>>8))
		case t <= 0x7fffffff:
			buf = append(buf, pkBinInt, byte(t), byte(t>>8), byte(t>>16), byte(t>>24))
		default:
			buf = append(buf, pkLong1, 5, byte(t), byte(t>>8), byte(t>>16), byte(t>>24), 0)
		}
	}
	p.buf = buf
}

// appendBlockPickle appends pickle.dumps((parent, tuple(tokens), extra_keys), protocol=5)
// to dst; tokens must be non-empty. extra_keys is None when lora and salt are both empty.
func appendBlockPickle(p *pickler, dst, parent []byte, tokens []uint32, lora, salt string) []byte {
	p.begin(dst)
	p.tupleOpen(3)
	p.bytes(parent)
	p.tupleOpen(len(tokens))
	p.ints(tokens)
	p.tupleClose(len(tokens))
	p.extraKeys(lora, salt)
	p.tupleClose(3)
	return p.end()
}

// extraKeys pickles a block's extra keys: None, or the tuple of the LoRA name and the
// cache salt that are set (a salt equal to the name refers to the name's memo slot when
// CPython would share the two str objects).
func (p *pickler) extraKeys(lora, salt string) {
	n := 0
	if lora != "" {
		n++
	}
	if salt != "" {
		n++
	}
	if n == 0 {
		p.none()
		return
	}
	p.tupleOpen(n)
	loraSlot := -1
	if lora != "" {
		loraSlot = p.memo
		p.str(lora, -1)
	}
	if salt != "" {
		same := -1
		if loraSlot >= 0 && salt == lora && sharedPyStr(salt) {
			same = loraSlot
		}
		p.str(salt, same)
	}
	p.tupleClose(n)
}

// appendStrPickle appends pickle.dumps(s, protocol=5): how vLLM hashes the NONE_HASH seed.
func appendStrPickle(p *pickler, dst []byte, s string) []byte {
	p.begin(dst)
	p.str(s, -1)
	return p.end()
}

// sharedPyStr reports whether CPython hands out one shared object for every str equal to
// s: the empty string and 1-character strings below U+0100.
func sharedPyStr(s string) bool {
	switch len(s) {
	case 0:
		return true
	case 1:
		return s[0] < 0x80
	case 2:
		// U+0080..U+00FF in UTF-8 is C2 xx or C3 xx.
		return s[0] == 0xc2 || s[0] == 0xc3
	}
	return false
}
