//go:build linux

package shard

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
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
		if in && strings.HasPrefix(l, "AnonHugePages:") {
			if _, err := fmt.Sscanf(strings.TrimPrefix(l, "AnonHugePages:"), "%d", &huge); err != nil {
				return 0, 0, err
			}
			return huge, size, nil
		}
	}
	return 0, 0, fmt.Errorf("no mapping holds %#x", addr)
}
