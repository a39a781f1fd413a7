//go:build linux

package shard

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"unsafe"
)

// TestLargeTablesGetHugePages: a bucket array from hugeTableBytes up is advised for
// transparent huge pages, so the kernel backs it with 2 MiB pages once touched (where
// THP is enabled at all: in "never" mode only the table's use is checked). Read from
// /proc/self/smaps: the advised range is its own mapping there. It runs in a child
// test process, whose heap is fresh: memory a test before it freed and the allocator
// hands out again was touched before the advice, and gets huge pages only once the
// kernel's khugepaged collapses it, in its own time.
func TestLargeTablesGetHugePages(t *testing.T) {
	if os.Getenv("SHARD_THP_CHILD") == "" {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestLargeTablesGetHugePages$", "-test.v")
		cmd.Env = append(os.Environ(), "SHARD_THP_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestLargeTablesGetHugePages") {
			t.Fatalf("child test: %v\n%s", err, out)
		}
		t.Logf("child: %s", out)
		return
	}
	lay := layoutFor(MaxEndpoints)
	tb := newTable(uint64(4*hugeTableBytes/64), MaxEndpoints/64, lay)
	for i := range tb.buckets {
		tb.buckets[i][0] = uint64(i) + 1 // touch every line
	}
	if tb.lookup(12345, 0) != 0 {
		t.Fatal("lookup on an advised table found a key nobody added")
	}
	mode, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil || strings.Contains(string(mode), "[never]") {
		t.Logf("THP unavailable here (%q, %v): only the table's use was checked", mode, err)
		return
	}
	huge, err := anonHugeKB(uintptr(unsafe.Pointer(&tb.buckets[0])))
	if err != nil {
		t.Fatal(err)
	}
	if huge == 0 {
		t.Fatalf("a %d MiB advised table has no huge pages (THP mode %q)", len(tb.buckets)*64>>20, strings.TrimSpace(string(mode)))
	}
	t.Logf("%d KiB of the %d MiB table in huge pages", huge, len(tb.buckets)*64>>20)
}

// anonHugeKB is the AnonHugePages of the /proc/self/smaps mapping holding addr.
func anonHugeKB(addr uintptr) (int, error) {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	in := false
	for sc.Scan() {
		l := sc.Text()
		var lo, hi uintptr
		if n, _ := fmt.Sscanf(l, "%x-%x", &lo, &hi); n == 2 && strings.Contains(l, " ") {
			in = addr >= lo && addr < hi
			continue
		}
		var kb int
		if in && strings.HasPrefix(l, "AnonHugePages:") {
			if _, err := fmt.Sscanf(strings.TrimPrefix(l, "AnonHugePages:"), "%d", &kb); err != nil {
				return 0, err
			}
			return kb, nil
		}
	}
	return 0, fmt.Errorf("no mapping holds %#x", addr)
}
