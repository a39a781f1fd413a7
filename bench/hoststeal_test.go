package bench

import (
	"os"
	"runtime"
	"testing"
	"time"
)

// The aggregate line of proc(5)'s /proc/stat: the total is user through steal (guest
// time is inside user and nice already), steal the eighth field.
func TestParseHostTicks(t *testing.T) {
	stat := []byte("cpu  4705 356 584 3699 23 23 0 91 7 3\ncpu0 2352 178 292 1849 11 11 0 45 3 1\nintr 1462898\n")
	got, ok := parseHostTicks(stat)
	if want := (hostTicks{total: 4705 + 356 + 584 + 3699 + 23 + 23 + 0 + 91, steal: 91}); !ok || got != want {
		t.Fatalf("parse = %+v, %v; want %+v", got, ok, want)
	}
	for _, bad := range []string{
		"cpu  4705 356 584 3699 23 23 0\n", // before 2.6.11: no steal field
		"cpu0 4705 356 584 3699 23 23 0 91\n",
		"cpu  4705 356 584 x 23 23 0 91\n",
		"",
	} {
		if got, ok := parseHostTicks([]byte(bad)); ok {
			t.Errorf("parse %q = %+v, want not ok", bad, got)
		}
	}
	if p := stealPercent(hostTicks{total: 1000, steal: 10}, hostTicks{total: 1400, steal: 110}); p != 25 {
		t.Errorf("steal percent %v, want 25", p)
	}
	if p := stealPercent(hostTicks{total: 1000, steal: 10}, hostTicks{total: 1000, steal: 10}); p != 0 {
		t.Errorf("steal percent over no time %v, want 0", p)
	}
}

// On Linux the reading is the machine's own: a CPU-bound stretch moves the total, and the
// windows' steal is a share of it. Elsewhere the account reads -1 ("-" in the tables).
func TestStealWindow(t *testing.T) {
	var w stealWindow
	if _, err := os.Stat("/proc/stat"); runtime.GOOS != "linux" || err != nil {
		w.begin()
		w.end()
		if p := w.percent(); p != -1 {
			t.Fatalf("steal without /proc/stat = %v, want -1", p)
		}
		return
	}
	if p := w.percent(); p != -1 {
		t.Fatalf("steal of no window = %v, want -1", p)
	}
	before, ok := readHostTicks()
	if !ok {
		t.Fatal("/proc/stat exists but did not parse")
	}
	for i := 0; i < 2; i++ {
		w.begin()
		for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
		}
		w.end()
	}
	after, _ := readHostTicks()
	// 100 ms on a CPU are 10 ticks at USER_HZ 100; the whole machine counts more.
	if after.total < before.total+5 || w.windows != 2 || w.spent.total < 5 || w.spent.total > after.total-before.total {
		t.Fatalf("ticks %+v -> %+v, windows %d summing %d", before, after, w.windows, w.spent.total)
	}
	if p := w.percent(); p < 0 || p > 100 {
		t.Fatalf("steal %v%%", p)
	}
}

// The overhead report names every row its host stole stealWarnPercent or more from, and
// says nothing when none was (or steal could not be read: -1).
func TestStealWarning(t *testing.T) {
	rows := []OverheadRow{
		{Path: "direct", Tokens: 4114, Steal: 0.4},
		{Path: "kvgate", Tokens: 4114, Steal: 2.5},
		{Path: "nginx", Tokens: 4114, Steal: stealWarnPercent},
		{Path: "kvgate-plain", Tokens: 4114, Steal: -1},
	}
	want := "WARN: host steal over the req/s rounds of kvgate at 4114 tokens (2.5%), nginx at 4114 tokens (1.0%): " +
		"the hypervisor ran other guests on these cores, so those req/s were measured on a slower machine."
	if got := stealWarning(rows); got != want {
		t.Errorf("warning\n got %q\nwant %q", got, want)
	}
	if got := stealWarning([]OverheadRow{rows[0], rows[3]}); got != "" {
		t.Errorf("warning without steal: %q", got)
	}
}
