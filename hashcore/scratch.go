package hashcore

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"
)

// scratch is the per-call encoding buffer, pooled so AppendKeys allocates nothing once
// warm. A Chain holds only immutable configuration, so it is safe for concurrent use.
type scratch struct {
	buf   []byte
	batch []byte // block messages: the fused loops' two slots, the pipelined loop's run
	ex    []byte // pre-encoded extra keys
	pk    pickler
}

// scratchSlots is a small lock-free free list of scratch buffers. Unlike sync.Pool it
// never drops buffers at random (sync.Pool does under the race detector) or at GC, so
// "zero allocations per call" holds and is testable in every build. More concurrent
// hashers than slots just allocate; their buffers are dropped when the list is full.
var scratchSlots [32]atomic.Pointer[scratch]

// maxPooledBuf bounds what a pooled buffer keeps: one huge block must not pin memory.
const maxPooledBuf = 256 << 10

func getScratch() *scratch {
	for i := range scratchSlots {
		if scratchSlots[i].Load() != nil {
			if s := scratchSlots[i].Swap(nil); s != nil {
				return s
			}
		}
	}
	return &scratch{buf: make([]byte, 0, 2048)}
}

func putScratch(s *scratch) {
	if cap(s.buf) > maxPooledBuf || cap(s.batch) > maxPooledBuf {
		return
	}
	s.pk.buf = nil
	for i := range scratchSlots {
		if scratchSlots[i].Load() == nil && scratchSlots[i].CompareAndSwap(nil, s) {
			return
		}
	}
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
