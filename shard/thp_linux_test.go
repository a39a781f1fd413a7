//go:build linux

package shard

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// TestLargeTablesGetHugePages: a table of a huge page or more is its own mapping, aligned
// to 2 MiB and rounded to whole huge pages, and the kernel backs it with huge pages once
// touched (where THP is enabled at all: in "never" mode only the table's use is
// checked). Read from /proc/self/smaps.
func TestLargeTablesGetHugePages(t *testing.T) {
	lay := layoutFor(MaxEndpoints)
	nb := bucketsFor(int(3*hugeBuckets), lay) // 36K buckets before rounding to huge pages
	if nb%hugeBuckets != 0 {
		t.Fatalf("bucketsFor = %d buckets, not whole huge pages of %d", nb, hugeBuckets)
	}
	if small := bucketsFor(1000, lay); small >= hugeBuckets {
		t.Fatalf("a small table got %d buckets", small)
	}
	// Narrow masks: only from 8 huge pages up, so rounding adds at most 1/8.
	if narrow := layoutFor(8); hugeTable(3*hugeBuckets, narrow) || !hugeTable(8*hugeBuckets, narrow) ||
		bucketsFor(int(3*hugeBuckets), narrow)%hugeBuckets == 0 {
		t.Fatal("an 8-endpoint table of 3 huge pages is mapped, or one of 8 is not")
	}
	tb := newTable(nb, MaxEndpoints/64, lay)
	addr := uintptr(unsafe.Pointer(&tb.buckets[0]))
	if addr%hugePageBytes != 0 {
		t.Fatalf("table at %#x, not 2 MiB aligned", addr)
	}
	for i := range tb.buckets {
		tb.buckets[i][0] = uint64(i) + 1 // touch every line
	}
	if tb.lookup(12345, 0) != 0 {
		t.Fatal("lookup on a mapped table found a key nobody added")
	}
	mode, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil || strings.Contains(string(mode), "[never]") {
		t.Logf("THP unavailable here (%q, %v): only the table's use was checked", mode, err)
		return
	}
	huge, size, err := anonHugeKB(addr)
	if err != nil {
		t.Fatal(err)
	}
	if size != len(tb.buckets)*64>>10 {
		t.Errorf("mapping of %d KiB holds a %d KiB table: not its own mapping", size, len(tb.buckets)*64>>10)
	}
	if huge == 0 {
		t.Fatalf("a %d MiB mapped table has no huge pages (THP mode %q)", len(tb.buckets)*64>>20, strings.TrimSpace(string(mode)))
	}
	t.Logf("%d KiB of the %d MiB table in huge pages", huge, len(tb.buckets)*64>>20)
	runtime.KeepAlive(tb)
}

// TestMappedTablesUnmapUnderReaders: shards whose tables are mappings off the Go heap
// are rebuilt again and again (growth, then shrinking) while readers score them and the
// collector runs; each replaced table's mapping is unmapped once no reader holds it. A
// reader that touched a table after its mapping went would crash the test binary; a
// table that kept its mapping would show as unmappedTables not moving.
func TestMappedTablesUnmapUnderReaders(t *testing.T) {
	inv, err := New(Config{Endpoints: 1024, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	// hugeBuckets*3 keys make the one table 2 huge pages.
	const rounds = 3
	n := int(hugeBuckets) * 3
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = benchKey(uint64(i) + 1)
	}
	held := keys[:512]
	inv.Add(1, held)
	unmapped0 := unmappedTables.Load()
	var stop atomic.Bool
	var wg sync.WaitGroup
	var scored atomic.Int64
	fail := make(chan string, 4)
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			scores := make([]int32, 1024)
			elig := NewMask(1024)
			elig.SetAll(1024)
			for !stop.Load() {
				// Endpoint 1 holds these keys throughout: every rebuild copies them.
				if inv.Score(held, elig, Overlap, scores); scores[1] != int32(len(held)) {
					select {
					case fail <- fmt.Sprintf("endpoint 1 scored %d of %d", scores[1], len(held)):
					default:
					}
					return
				}
				scored.Add(1)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			runtime.GC()
			time.Sleep(time.Millisecond)
		}
	}()
	for round := 0; round < rounds; round++ {
		for i := 512; i < n; i += 64 {
			inv.Add(2, keys[i:i+64]) // grows: rebuilds publish new mappings
		}
		for i := 512; i < n; i += 64 {
			inv.Remove(2, keys[i:i+64]) // shrinks back below a huge page
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for unmappedTables.Load() == unmapped0 && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	select {
	case f := <-fail:
		t.Fatal(f)
	default:
	}
	if got := unmappedTables.Load() - unmapped0; got == 0 {
		t.Fatalf("%d rebuilds, no replaced mapping unmapped", inv.Stats().Rebuilds)
	} else {
		t.Logf("%d rebuilds, %d mappings unmapped, %d scores meanwhile", inv.Stats().Rebuilds, got, scored.Load())
	}
	if scored.Load() == 0 {
		t.Fatal("readers never scored")
	}
}

// anonHugeKB is the AnonHugePages and the size of the /proc/self/smaps mapping holding addr.
func anonHugeKB(addr uintptr) (huge, size int, err error) {
	return smapsKB(addr, "AnonHugePages:")
}

// smapsKB reads one KiB field (such as "Rss:") of the mapping that holds addr.
func smapsKB(addr uintptr, field string) (kb, size int, err error) {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	in := false
	for sc.Scan() {
		l := sc.Text()
		var lo, hi uintptr
		if n, _ := fmt.Sscanf(l, "%x-%x", &lo, &hi); n == 2 && strings.Contains(l, " ") {
			if in = addr >= lo && addr < hi; in {
				size = int(hi-lo) >> 10
			}
			continue
		}
		if in && strings.HasPrefix(l, field) {
			if _, err := fmt.Sscanf(strings.TrimPrefix(l, field), "%d", &kb); err != nil {
				return 0, 0, err
			}
			return kb, size, nil
		}
	}
	return 0, 0, fmt.Errorf("no mapping holds %#x", addr)
}

// TestRetiredTablesCollected: replaced mapped tables are unmapped without anyone calling
// the collector: once retireCollectBytes of them wait for their cleanup, their release
// (retireGrace after retireTable) starts a collection, so the mappings held beyond the
// live tables stay under about that bound on a heap that would not collect by itself
// (this test allocates almost nothing).
// Tables retired while that collection runs wait for the next one, so up to the bound of
// them may stay mapped at the end.
func TestRetiredTablesCollected(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // no collection but the ones retireTable starts
	lay := layoutFor(1024)
	unmapped0, retired0 := unmappedTables.Load(), retiredBytes.Load()
	per := int64(hugeBuckets) * 64
	bound := int(retireCollectBytes / per)
	n := 3*bound + 2
	for i := 0; i < n; i++ {
		tb := newTable(hugeBuckets, 1, lay)
		if tb.retired == nil {
			t.Skip("no mapped tables here (mmap failed): nothing to collect")
		}
		retireTable(tb)
		retireTable(tb) // twice: counted once
	}
	want := int64(n - bound)
	deadline := time.Now().Add(10 * time.Second)
	for unmappedTables.Load()-unmapped0 < want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := unmappedTables.Load() - unmapped0; got < want {
		t.Fatalf("%d of %d retired tables (%d MiB) unmapped; want all but at most %d", got, n, int64(n)*per>>20, bound)
	}
	for collecting.Load() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// (Other tests' replaced tables may be unmapped meanwhile: the count may fall below.)
	if left := retiredBytes.Load() - retired0; left >= retireCollectBytes {
		t.Fatalf("%d MiB of retired tables still mapped, at or above the %d MiB bound", left>>20, retireCollectBytes>>20)
	}
}

// TestTouchBacksEveryPage: touch leaves a fresh mapped table wholly resident (Rss from
// /proc/self/smaps, none before), through one madvise where the kernel has
// MADV_POPULATE_WRITE (5.14 on), which this test requires of such a kernel.
func TestTouchBacksEveryPage(t *testing.T) {
	lay := layoutFor(MaxEndpoints)
	tb := newTable(bucketsFor(int(3*hugeBuckets), lay), MaxEndpoints/64, lay)
	addr := uintptr(unsafe.Pointer(&tb.buckets[0]))
	rss, size, err := smapsKB(addr, "Rss:")
	if err != nil {
		t.Fatal(err)
	}
	if rss != 0 {
		t.Fatalf("a fresh %d KiB table has %d KiB resident before touch", size, rss)
	}
	tb.touch()
	if rss, _, err = smapsKB(addr, "Rss:"); err != nil {
		t.Fatal(err)
	}
	if rss != size {
		t.Fatalf("after touch %d of %d KiB resident", rss, size)
	}
	var u syscall.Utsname
	if err := syscall.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var rel []byte
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		rel = append(rel, byte(c))
	}
	var major, minor int
	if _, err := fmt.Sscanf(string(rel), "%d.%d", &major, &minor); err != nil {
		t.Fatalf("kernel release %q: %v", rel, err)
	}
	fresh := newTable(tb.nb, MaxEndpoints/64, lay)
	if ok := populate(fresh.buckets); ok != (major > 5 || major == 5 && minor >= 14) {
		t.Fatalf("populate = %v on kernel %s", ok, rel)
	}
	runtime.KeepAlive(tb)
	runtime.KeepAlive(fresh)
}

// TestReplacedTablesGiveMemoryBack: a replaced mapped table stays readable for the grace
// readers get, then its pages (buckets and mapped spill chunks) are no longer resident
// (mincore) although the table is still reachable, and reading it finds nothing.
func TestReplacedTablesGiveMemoryBack(t *testing.T) {
	inv, err := New(Config{Endpoints: 1024, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	// Keys held by 10 endpoints spill to bitmasks: 1,000 of them fill the bitmask
	// arena's chunks 0-5, the last of them 64 KiB, mapped. 3 huge pages' worth of keys
	// make the table mapped.
	shared := make([]uint64, 1000)
	for i := range shared {
		shared[i] = benchKey(uint64(i) + 1)
	}
	for ep := 0; ep < 10; ep++ {
		inv.Add(ep, shared)
	}
	own := make([]uint64, 3*hugeBuckets)
	for i := range own {
		own[i] = benchKey(uint64(i) + 1e6)
	}
	for i := 0; i < len(own); i += 512 {
		inv.Add(5, own[i:i+512])
	}
	inv.waitCompactions()
	old := inv.tabs[0].Load()
	if old.retired == nil {
		t.Skip("no mapped tables here (mmap failed)")
	}
	var chunk *spillChunk
	for i := range old.spill.chunks {
		if ch := old.spill.chunks[i].Load(); ch != nil && ch.mapped {
			chunk = ch
		}
	}
	if chunk == nil {
		t.Fatalf("no mapped spill chunk among %d spilled sets", old.spilled.Load())
	}
	buckets := unsafe.Slice((*byte)(unsafe.Pointer(&old.buckets[0])), len(old.buckets)*64)
	words := unsafe.Slice((*byte)(unsafe.Pointer(&chunk.w[0])), len(chunk.w)*8)
	if residentPages(t, buckets) == 0 || residentPages(t, words) == 0 {
		t.Fatal("the live table's pages are not resident")
	}
	home := func(k uint64) uint64 { return old.home(mix(k), inv.shardBits) }

	inv.ClearAll() // replaces the table
	if inv.tabs[0].Load() == old {
		t.Fatal("ClearAll kept the table")
	}
	// Within the grace a reader still holding the table finds what it held.
	if old.lookup(own[7], home(own[7])) == 0 || old.lookup(shared[3], home(shared[3])) == 0 {
		t.Fatal("the replaced table lost its keys at once")
	}
	deadline := time.Now().Add(retireGrace + 10*time.Second)
	for residentPages(t, buckets)+residentPages(t, words) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if b, w := residentPages(t, buckets), residentPages(t, words); b+w > 0 {
		t.Fatalf("%s after the replacement: %d bucket pages and %d spill chunk pages still resident",
			time.Since(deadline.Add(-retireGrace-10*time.Second)), b, w)
	}
	if old.lookup(own[7], home(own[7])) != 0 || old.lookup(shared[3], home(shared[3])) != 0 {
		t.Fatal("a released table still holds keys")
	}
	runtime.KeepAlive(old)
}

// residentPages is the number of b's pages in memory (mincore).
func residentPages(t *testing.T, b []byte) int {
	ps := os.Getpagesize()
	vec := make([]byte, (len(b)+ps-1)/ps)
	if _, _, e := syscall.Syscall(syscall.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)),
		uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatalf("mincore: %v", e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// TestSpillChunksOffHeap: an arena's chunks of spillMapBytes and up are not Go heap
// memory (the heap grows by a small part of the arena's bytes), and they are unmapped
// once the arena is unreachable.
func TestSpillChunksOffHeap(t *testing.T) {
	const bw = 16                                            // 1,024 endpoints
	const blocks = 1<<spillBaseShift<<13 - 1<<spillBaseShift // chunks 0-12, 16 MiB of words
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	a := new(spillArena)
	for range blocks {
		a.alloc(bw)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	mapped := 0
	for i := range a.chunks {
		if ch := a.chunks[i].Load(); ch != nil && ch.mapped {
			if len(ch.w)*8 < spillMapBytes {
				t.Fatalf("chunk %d of %d bytes is mapped, under spillMapBytes", i, len(ch.w)*8)
			}
			mapped++
		} else if ch != nil && len(ch.w)*8 >= spillMapBytes {
			t.Fatalf("chunk %d of %d bytes is on the heap", i, len(ch.w)*8)
		}
	}
	if mapped != 8 { // chunks 5-12
		t.Fatalf("%d chunks mapped, want 8", mapped)
	}
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	if arena := a.bytes.Load(); heap > 2<<20 || arena < 16<<20 {
		t.Fatalf("the heap grew %d KiB for an arena of %d KiB", heap>>10, arena>>10)
	}
	runtime.KeepAlive(a)
	u0 := unmappedChunks.Load()
	a = nil
	deadline := time.Now().Add(10 * time.Second)
	for unmappedChunks.Load()-u0 < int64(mapped) && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if got := unmappedChunks.Load() - u0; got < int64(mapped) {
		t.Fatalf("%d of %d mapped chunks unmapped once unreachable", got, mapped)
	}
}
