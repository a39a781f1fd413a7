package hashcore

import (
	"encoding/binary"
	"sync"
	"unsafe"
)

// scratch is the per-call encoding buffer, pooled so AppendKeys allocates nothing once
// warm. A Chain holds only immutable configuration, so it is safe for concurrent use.
type scratch struct {
	buf []byte
	pk  pickler
}

var scratchPool = sync.Pool{New: func() any { return &scratch{buf: make([]byte, 0, 2048)} }}

func getScratch() *scratch { return scratchPool.Get().(*scratch) }

func putScratch(s *scratch) {
	// Keep pooled buffers bounded: one huge block must not pin megabytes forever.
	if cap(s.buf) > 1<<20 {
		s.buf = make([]byte, 0, 2048)
	}
	s.pk.buf = nil
	scratchPool.Put(s)
}

// littleEndian is true when a []uint32's memory already is its little-endian encoding.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// appendUint32sLE appends each token as 4 little-endian bytes.
func appendUint32sLE(dst []byte, tokens []uint32) []byte {
	if len(tokens) == 0 {
		return dst
	}
	if littleEndian {
		return append(dst, unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens))...)
	}
	for _, t := range tokens {
		dst = binary.LittleEndian.AppendUint32(dst, t)
	}
	return dst
}
