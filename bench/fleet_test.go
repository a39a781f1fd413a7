package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
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
	if r.LagLost != 0 || r.LagP50 <= 0 || r.LagP99 < r.LagP50 || r.LagP99 > fleetMarkerTimeout {
		t.Errorf("lag p50 %v p99 %v, %d lost", r.LagP50, r.LagP99, r.LagLost)
	}
	if r.Hits != cfg.Decisions || r.Decision <= 0 {
		t.Errorf("%d of %d decisions were kv-hit, decision %v", r.Hits, cfg.Decisions, r.Decision)
	}
	if r.RSSMB <= 0 || r.BytesPerEntry <= 0 || r.IngestCPU <= 0 || r.EventsPerSec <= 0 {
		t.Errorf("missing measurements: %+v", r)
	}
	var tbl bytes.Buffer
	WriteFleetTable(&tbl, rows)
	if !strings.HasPrefix(tbl.String(), "| endpoints | entries | RSS MB | B/entry | ingest CPU % | lag p50 ms | lag p99 ms | decision us |") ||
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
