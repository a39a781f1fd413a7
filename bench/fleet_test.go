package bench

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testfix"
)

// TestFleetRunner runs the fleet simulator at N=4 with a few thousand entries against a
// real child kvgate: every marker must be seen (the contract the runner keys markers
// with is kvgate's), every decision must be a KV hit on the endpoints holding the
// prompt, the entries kvgate reports must be what the publishers hold, and the table
// and plots must be written.
// Both publisher kinds: internal/zmtp's (the default) and zmq4's.
func TestFleetRunner(t *testing.T) {
	kvgate := buildKvgate(t)
	for _, pubs := range []string{"zmtp", "zmq4"} {
		t.Run(pubs, func(t *testing.T) { testFleetRunner(t, kvgate, pubs) })
	}
}

func testFleetRunner(t *testing.T, kvgate, pubs string) {
	cfg := FleetConfig{Sizes: []int{4}, Entries: 4096, EventRate: 100, Measure: 1500 * time.Millisecond,
		Markers: 8, Decisions: 5, Kvgate: kvgate, Model: "qwen3", Tokenizer: testfix.TokenizerDir(t, "qwen3"), Seed: 1,
		Publishers: pubs}
	var progress bytes.Buffer
	cfg.Progress = &progress
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rows, err := RunFleet(ctx, cfg)
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	if len(rows) != 1 {
		t.Fatalf("%d rows", len(rows))
	}
	r := rows[0]
	t.Logf("%+v\n%s", r, progress.String())
	// The fill holds 4096 entries in 16-key groups, plus the prompt's 384 + 256 blocks
	// (endpoint 3 holds 128 of the same keys, endpoint 2 the 256), plus each marker's blocks.
	if want := int64(4096 + 384 + 256 + 128 + cfg.Markers*fleetMarkerBlocks); r.Entries != want {
		t.Errorf("entries %d, want %d", r.Entries, want)
	}
	if r.LagLost != 0 || r.RoutedP50 <= 0 || r.RoutedP99 < r.RoutedP50 || r.RoutedP99 > fleetMarkerTimeout {
		t.Errorf("routed lag p50 %v p99 %v, %d lost", r.RoutedP50, r.RoutedP99, r.LagLost)
	}
	// Every churn batch of the window is in kvgate's lag histogram (the window's batches
	// applied, to within the batches in flight at its two scrapes).
	if r.LagBatches <= 0 || r.LagP50 <= 0 || r.LagP99 < r.LagP50 || r.LagP99 > time.Second {
		t.Errorf("lag p50 %v p99 %v over %.0f batches", r.LagP50, r.LagP99, r.LagBatches)
	}
	if r.Hits != cfg.Decisions || r.Decision <= 0 {
		t.Errorf("%d of %d decisions were kv-hit, decision %v", r.Hits, cfg.Decisions, r.Decision)
	}
	if r.RSSMB <= 0 || r.BytesPerEntry <= 0 || r.IngestCPU <= 0 || r.EventsPerSec <= 0 {
		t.Errorf("missing measurements: %+v", r)
	}
	if runtime.GOOS == "linux" && (r.Steal < 0 || r.Steal > 100) {
		t.Errorf("host steal %.2f%%, want a share of the window read from /proc/stat", r.Steal)
	}
	var tbl bytes.Buffer
	WriteFleetTable(&tbl, rows)
	if !strings.HasPrefix(tbl.String(), "| endpoints | entries | RSS MB | B/entry | ingest CPU % | lag p50 ms | lag p99 ms | decision us | routed lag p50 ms | routed lag p99 ms | host steal % |") ||
		strings.Count(tbl.String(), "\n") != 3 {
		t.Errorf("table:\n%s", tbl.String())
	}
	dir := t.TempDir()
	names, err := WriteFleetPlots(dir, rows)
	if err != nil || len(names) != 6 {
		t.Fatalf("plots %v: %v", names, err)
	}
	for _, n := range names {
		if b, err := os.ReadFile(filepath.Join(dir, n)); err != nil || !bytes.Contains(b, []byte("<svg")) {
			t.Errorf("%s: not an SVG (%v)", n, err)
		}
	}
}

// TestFleetRejectsBadConfig: sizes outside 1..1024 and missing parts are refused before
// anything starts.
func TestFleetRejectsBadConfig(t *testing.T) {
	ok := FleetConfig{Sizes: []int{4}, Kvgate: "kvgate", Model: "m", Tokenizer: "dir"}
	for name, mut := range map[string]func(*FleetConfig){
		"no sizes":      func(c *FleetConfig) { c.Sizes = nil },
		"size 0":        func(c *FleetConfig) { c.Sizes = []int{0} },
		"size 1025":     func(c *FleetConfig) { c.Sizes = []int{8, 1025} },
		"negative rate": func(c *FleetConfig) { c.EventRate = -1 },
		"no kvgate":     func(c *FleetConfig) { c.Kvgate = "" },
		"publishers":    func(c *FleetConfig) { c.Publishers = "libzmq" },
	} {
		c := ok
		mut(&c)
		if _, err := RunFleet(context.Background(), c); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestFleetEntries: by default each size fills its endpoints' share of 100M entries at
// 1,024 (issue 13's size), so the per-endpoint inventory is the same at every size; an
// explicit Entries is the fill at every size.
func TestFleetEntries(t *testing.T) {
	for _, c := range []struct{ entries, n, want int }{
		{0, 1024, 100_000_000},
		{0, 256, 25_000_000},
		{0, 8, 781_250},
		{0, 1, 97_656},
		{4096, 4, 4096},
		{4096, 1024, 4096},
	} {
		if got := FleetEntries(FleetConfig{Entries: c.entries}, c.n); got != c.want {
			t.Errorf("entries %d at N=%d: %d, want %d", c.entries, c.n, got, c.want)
		}
	}
}

// TestLagQuantile: quantiles of a histogram's growth between two scrapes, linear within
// the bucket, worked by hand: 100 batches, 50 in (0, 1 ms], 40 in (1, 2], 9 in (2, 5], 1
// past 10 ms.
func TestLagQuantile(t *testing.T) {
	le := []float64{0.001, 0.002, 0.005, 0.01, math.Inf(1)}
	a := &cumHist{le: le, cum: []float64{10, 10, 10, 10, 10}}
	b := &cumHist{le: le, cum: []float64{60, 100, 109, 109, 110}}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{
		{0.25, 500 * time.Microsecond},  // rank 25 of the first bucket's 50
		{0.50, 1 * time.Millisecond},    // rank 50: the first bucket's top
		{0.70, 1500 * time.Microsecond}, // rank 70: 20 of the second bucket's 40
		{0.99, 5 * time.Millisecond},    // rank 99: the third bucket's top
		{1.00, 10 * time.Millisecond},   // rank 100 lies in +Inf: the largest finite bound
	} {
		if got := cumQuantile(a, b, c.q); got != c.want {
			t.Errorf("q %.2f: %v, want %v", c.q, got, c.want)
		}
	}
	if got := cumQuantile(b, b, 0.99); got != 0 {
		t.Errorf("no batches: %v, want 0", got)
	}
}
