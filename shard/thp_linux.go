//go:build linux

package shard

import (
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// hugePageBytes is a transparent huge page (x86-64 and arm64 with 4 KiB base pages).
const hugePageBytes = 2 << 20

// hugeBuckets is the buckets of one huge page, the unit huge-page tables are mapped in.
const hugeBuckets = hugePageBytes / uint64(unsafe.Sizeof(bucket{}))

// hugeTable reports whether a table of nb buckets of layout lay lives in huge pages (a
// mapping of its own, rounded up to whole huge pages). Why not every table of a huge page
// or more: the rounding costs up to 2 MiB per table, which the fleet layout (sparse sets,
// <= 25 B per entry, 12-14 used) affords from one huge page up, but a narrow-mask table
// of a few MiB would break its <= 24 B/key bound; those get huge pages from 8 of them up,
// where the rounding adds at most 1/8.
func hugeTable(nb uint64, lay layout) bool {
	return nb >= hugeBuckets && (lay.sparse || nb >= 8*hugeBuckets)
}

// roundBuckets rounds a bucket count of a huge-page table up to whole huge pages: the
// mapping is made of them anyway, so the buckets past nb are room the table may as well
// use (it rebuilds later) rather than a tail of 4 KiB pages or mapped memory left idle.
func roundBuckets(nb uint64, lay layout) uint64 {
	if !hugeTable(nb, lay) {
		return nb
	}
	return (nb + hugeBuckets - 1) / hugeBuckets * hugeBuckets
}

// mapBuckets returns nb (a roundBuckets count of a hugeTable) zeroed buckets
// mapped off the Go heap, aligned to a huge page and advised for transparent huge
// pages, and the mapping to unmap once the table is unreachable; ok is false when the
// mapping failed (the caller then takes Go heap memory).
//
// Why: a probe lands on a random cache line of the table, so with 4 KiB pages every
// probe of a table far beyond the TLB's reach also misses the TLB, and at fleet sizes
// (a GiB of index; 3-4 MiB per shard at 100M entries over 256 shards) the page walk is
// itself one or more DRAM accesses, more under a hypervisor's nested paging. Go heap
// memory gets huge pages only where an allocation happens to cover an aligned 2 MiB
// range the allocator had never touched; a mapping of our own is aligned, fresh (the
// kernel backs each huge page on first touch, in "madvise" mode too) and its own VMA.
// The table's memory then no longer counts toward the Go heap's GC pacing; the arrays
// hold no pointers, so the collector never scanned them anyway.
func mapBuckets(nb uint64) (buckets []bucket, mem []byte, ok bool) {
	n := int(nb) * int(unsafe.Sizeof(bucket{}))
	// Over-map by one huge page, then trim the unaligned head and the tail.
	raw, err := syscall.Mmap(-1, 0, n+hugePageBytes, syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		return nil, nil, false
	}
	base := uintptr(unsafe.Pointer(&raw[0]))
	head := int((hugePageBytes - base%hugePageBytes) % hugePageBytes)
	if head > 0 {
		_ = munmap(raw[:head])
	}
	_ = munmap(raw[head+n:]) // at least one page: head < hugePageBytes
	mem = raw[head : head+n : head+n]
	// Advisory: without THP support the table still works, on 4 KiB pages.
	_ = syscall.Madvise(mem, syscall.MADV_HUGEPAGE)
	return unsafe.Slice((*bucket)(unsafe.Pointer(&mem[0])), nb), mem, true
}

// madvPopulateWrite is Linux's MADV_POPULATE_WRITE (5.14 and later; the syscall
// package predates it).
const madvPopulateWrite = 23

// populate faults b's pages in, writable, with one madvise(MADV_POPULATE_WRITE); false
// when the kernel cannot (older than 5.14), and the caller writes each page instead.
//
// Why a system call rather than the writes: backing a fresh huge-page table means direct
// compaction at each fault, 23-28 ms for a 10 MiB table here, and a page fault keeps the
// goroutine's P the whole time, so at 100M entries (a compaction's table made every second
// or so) one of two Ps was gone ~3% of the time and the event appliers queued behind the
// other. In a system call the runtime hands the P to another thread.
func populate(b []bucket) bool {
	if len(b) == 0 {
		return true
	}
	n := uintptr(len(b)) * unsafe.Sizeof(bucket{})
	_, _, e := syscall.Syscall(syscall.SYS_MADVISE, uintptr(unsafe.Pointer(&b[0])), n, madvPopulateWrite)
	return e == 0
}

// munmap unmaps part of a mapping syscall.Mmap made (syscall.Munmap only takes whole ones).
func munmap(b []byte) error {
	_, _, e := syscall.Syscall(syscall.SYS_MUNMAP, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// unmappedTables and unmappedChunks count mappings unmapped (tests: tables and spill
// chunks do not leak their mappings).
var unmappedTables, unmappedChunks atomic.Int64

// spillMapBytes is the smallest spill chunk mapped off the Go heap (see spillChunk): 16
// pages, so rounding to pages wastes little, and a table's smaller chunks (at most as
// many bytes again) stay on the heap.
const spillMapBytes = 64 << 10

// newSpillChunk returns a chunk of words zeroed words: a mapping of its own from
// spillMapBytes up, unmapped once the chunk is unreachable (a reader holds the table,
// which holds its chunks), else Go heap memory, as it is when the mapping fails.
func newSpillChunk(words int) *spillChunk {
	if n := words * 8; n >= spillMapBytes {
		mem, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
		if err == nil {
			ch := &spillChunk{w: unsafe.Slice((*uint64)(unsafe.Pointer(&mem[0])), words), mapped: true}
			runtime.AddCleanup(ch, func(mem []byte) {
				_ = syscall.Munmap(mem)
				unmappedChunks.Add(1)
			}, mem)
			return ch
		}
	}
	return &spillChunk{w: make([]uint64, words)}
}

// unmapWhenUnreachable unmaps a table's bucket mapping once the table is unreachable.
// That is the same grace period RCU gets from the collector for heap tables: a reader
// holds the *table while it probes (every reader path keeps it live to its last bucket
// load, runtime.KeepAlive where the compiler could otherwise drop it early).
func unmapWhenUnreachable(t *table, mem []byte) {
	runtime.AddCleanup(t, func(m mapping) {
		_ = munmap(m.mem)
		unmappedTables.Add(1)
		if m.retired.Load() {
			retiredBytes.Add(-int64(len(m.mem)))
		}
	}, mapping{mem, t.retired})
}

// mapping is what a table's cleanup needs (it must not reach the table itself).
type mapping struct {
	mem     []byte
	retired *atomic.Bool
}

// retireTable notes that t, replaced by a newer table, waits for its cleanup, and gives
// its memory back to the kernel retireGrace later (release), while the mapping stays
// until the cleanup unmaps it: the RSS then holds about one second of replaced tables
// (~15 MB at 100M entries under churn).
//
// Why the cleanup needs help: a mapping is off the Go heap, so the collector's pacing
// does not see it, and the cleanup runs only after a collection. With the index off the
// heap, the heap is small and collections are rare: at 100M entries, churn that compacts
// every shard in turn kept 0.4-1.4 GB of replaced tables mapped (bench/RESULTS.md,
// session 8). So once the released tables waiting for their cleanup pass
// retireCollectBytes, one collection is started (never two at once): the address space
// held beyond the live tables stays about that bound, for a collection of a small heap
// every few hundred MiB of rebuilds.
func retireTable(t *table) {
	if t.retired == nil || t.retired.Swap(true) {
		return
	}
	retiredBytes.Add(int64(len(t.buckets)) * int64(unsafe.Sizeof(bucket{})))
	// The timer holds t until release returns, so the mapping release advises is still
	// t's (it is unmapped only once t is unreachable).
	time.AfterFunc(retireGrace, t.release)
}

// retireGrace is how long a replaced table keeps its memory. Readers hold a table for
// one lookup or one request's score, tens of microseconds, so a reader still probing a
// table a second after its replacement is one the scheduler stopped for that long; it
// would read zeros, every key absent (a routing miss, no more: probes end at an empty
// slot). Writers only write the published table, and a compaction still copying the
// replaced table drops its copy at the publish (compact.go).
const retireGrace = time.Second

// release gives a replaced table's pages back to the kernel (MADV_DONTNEED: reads find
// zeros from then on), the bucket mapping and the mapped spill chunks, and starts a
// collection if the tables released wait past retireCollectBytes.
func (t *table) release() {
	dontNeed(unsafe.Pointer(&t.buckets[0]), len(t.buckets)*int(unsafe.Sizeof(bucket{})))
	for _, a := range [...]*spillArena{&t.lists, &t.spill} {
		for i := range a.chunks {
			if ch := a.chunks[i].Load(); ch != nil && ch.mapped {
				dontNeed(unsafe.Pointer(&ch.w[0]), len(ch.w)*8)
			}
		}
	}
	releases.Add(1)
	if retiredBytes.Load() >= retireCollectBytes && collecting.CompareAndSwap(false, true) {
		go collectRetired()
	}
}

// dontNeed gives the n bytes of a mapping at p back to the kernel (MADV_DONTNEED).
func dontNeed(p unsafe.Pointer, n int) {
	_ = syscall.Madvise(unsafe.Slice((*byte)(p), n), syscall.MADV_DONTNEED)
}

// collectRetired runs collections until the replaced tables awaiting their unmapping
// are under retireCollectBytes, a few at most. Why more than one: tables released while
// a collection runs are not freed by it, and a burst of rebuilds (a shrink of every
// shard, a fleet cleared) may retire many at once and then none, so no later release
// would start the collection that frees them. The pause lets the cleanups a collection
// queued run before the count is read again. Tables released while the collections ran
// found one running and started none, so when there were such releases and the count is
// still over the bound, it goes round again.
func collectRetired() {
	for {
		seen := releases.Load()
		for range 4 {
			runtime.GC()
			time.Sleep(10 * time.Millisecond)
			if retiredBytes.Load() < retireCollectBytes {
				break
			}
		}
		collecting.Store(false)
		if releases.Load() == seen || retiredBytes.Load() < retireCollectBytes || !collecting.CompareAndSwap(false, true) {
			return
		}
	}
}

// retireCollectBytes is how much replaced tables may wait for their unmapping before a
// collection is started.
const retireCollectBytes = 128 << 20

var (
	retiredBytes atomic.Int64 // mapped bytes of replaced tables not unmapped yet
	releases     atomic.Int64 // replaced tables released so far
	collecting   atomic.Bool  // a collection release started is running
)
