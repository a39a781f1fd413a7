//go:build linux

package shard

import (
	"syscall"
	"unsafe"
)

// hugeTableBytes is the table size from which bucket arrays ask the kernel for
// transparent huge pages.
const hugeTableBytes = 4 << 20

// adviseHuge asks for transparent huge pages on a large bucket array before its first
// touch. Why: a probe lands on a random cache line of the table, so with 4 KiB pages
// every probe of a table far larger than the TLB's reach also misses the TLB, and at
// fleet sizes (a GiB of index) the page walk is itself a DRAM access. With THP in
// "madvise" mode (the common default) nothing else asks for them. Advisory: an error
// (no THP support) changes nothing. Fresh memory gets huge pages as it is first touched;
// memory the allocator reuses was touched already, and gets them when khugepaged
// collapses it.
func adviseHuge(buckets []bucket) {
	n := len(buckets) * int(unsafe.Sizeof(bucket{}))
	if n < hugeTableBytes {
		return
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(&buckets[0])), n)
	_ = syscall.Madvise(b, syscall.MADV_HUGEPAGE)
}
