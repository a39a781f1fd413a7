package bench

import (
	"bytes"
	"github.com/kvgate/kvgate/bench/enginesim"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Rate xf divides every arrival and think time by f and leaves the prompts alone; the
// source workload is not modified.
func TestAtRateScalesTime(t *testing.T) {
	w := SharedPrefix{SystemPrompts: 2, Users: 5, Turns: 2, SystemTokens: 10, TurnTokens: 3, Spread: 4 * time.Second,
		Think: 300 * time.Millisecond, Seed: 2}.Build()
	before := w.Sessions[3].At
	for _, f := range []float64{0.5, 2, 4} {
		s := w.AtRate(f)
		if s.Requests() != w.Requests() || s.Name != w.Name {
			t.Fatalf("x%g: %d requests, name %q", f, s.Requests(), s.Name)
		}
		for i := range w.Sessions {
			a, b := w.Sessions[i], s.Sessions[i]
			if want := time.Duration(float64(a.At) / f); b.At != want {
				t.Fatalf("x%g session %d: at %v, want %v", f, i, b.At, want)
			}
			if want := time.Duration(float64(a.Think) / f); b.Think != want {
				t.Fatalf("x%g session %d: think %v, want %v", f, i, b.Think, want)
			}
			if b.Prompts[1] != a.Prompts[1] || b.System != a.System {
				t.Fatalf("x%g session %d: prompts changed", f, i)
			}
		}
		if got, want := s.Span(), time.Duration(float64(w.Span())/f); got != want {
			t.Fatalf("x%g: span %v, want %v", f, got, want)
		}
	}
	if w.Sessions[3].At != before {
		t.Fatal("AtRate modified its source")
	}
	// A trace replays at twice the rate with half its inter-arrival gaps.
	tw, err := Trace{Path: "t", BlockTokens: 4}.read(strings.NewReader(`{"timestamp": 0, "input_length": 10, "hash_ids": [1]}
{"timestamp": 800, "input_length": 10, "hash_ids": [2]}`))
	if err != nil {
		t.Fatal(err)
	}
	if g := tw.AtRate(2).Sessions[1].At; g != 400*time.Millisecond {
		t.Fatalf("trace x2: second arrival %v, want 400ms", g)
	}
}

func TestParseRateScales(t *testing.T) {
	got, err := ParseRateScales("0.5, 1,2,4")
	if err != nil || len(got) != 4 || got[0] != 0.5 || got[3] != 4 {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []string{"", "1,,2", "0", "-1", "x2", "NaN", "1,inf"} {
		if _, err := ParseRateScales(bad); err == nil || !strings.Contains(err.Error(), "-rate-scale") {
			t.Errorf("%q: err %v, want one naming -rate-scale", bad, err)
		}
	}
}

// fakeResult is a result with the given TTFTs (ms) per policy.
func fakeResult(ttfts map[string][]int) *Result {
	r := &Result{Workload: "w", Engines: 2}
	for _, name := range []string{"rr", "kv-exact", "oracle"} {
		ms, ok := ttfts[name]
		if !ok {
			continue
		}
		p := PolicyResult{Policy: name, Requests: len(ms), Endpoints: make([]enginesim.Stats, 2)}
		for _, v := range ms {
			p.TTFT = append(p.TTFT, time.Duration(v)*time.Millisecond)
			p.E2E = append(p.E2E, time.Duration(v+10)*time.Millisecond)
		}
		r.Policies = append(r.Policies, p)
	}
	return r
}

// The sweep report has the TTFT-versus-load table (p50 / p90 per policy and level), one
// section per level with the standard table, and the plots it was given; the plot files
// are SVGs naming every policy.
func TestSweepReportAndPlots(t *testing.T) {
	sw := &Sweep{Workload: "hot-prefix (test)", Levels: []Level{
		{RateScale: 1, Requests: 10, Span: 2 * time.Second, Result: fakeResult(map[string][]int{
			"rr": {10, 10, 10, 10, 10, 10, 10, 10, 10, 40}, "kv-exact": {5, 5, 5, 5, 5, 5, 5, 5, 5, 5}, "oracle": {4, 4, 4, 4, 4, 4, 4, 4, 4, 4}})},
		{RateScale: 4, Requests: 10, Span: 500 * time.Millisecond, Result: fakeResult(map[string][]int{
			"rr": {20, 20, 20, 20, 20, 20, 20, 20, 90, 90}, "kv-exact": {8, 8, 8, 8, 8, 8, 8, 8, 8, 30}})},
	}}
	var tbl bytes.Buffer
	sw.WriteLoadTable(&tbl)
	for _, want := range []string{"| policy | x1 p50 / p90 ms | x4 p50 / p90 ms |", "| rr | 10.0 / 10.0 | 20.0 / 90.0 |",
		"| kv-exact | 5.0 / 5.0 | 8.0 / 8.0 |", "| oracle | 4.0 / 4.0 | - |"} {
		if !strings.Contains(tbl.String(), want) {
			t.Errorf("load table lacks %q:\n%s", want, tbl.String())
		}
	}
	dir := t.TempDir()
	plots, err := WriteSweepPlots(dir, "svg", []*Sweep{sw})
	if err != nil {
		t.Fatal(err)
	}
	if len(plots) != 1 || plots[0].Load != "w1-ttft-vs-load.svg" || len(plots[0].Levels) != 2 || plots[0].Levels[1][0] != "w1-x4-ttft-cdf.svg" {
		t.Fatalf("plots %+v", plots)
	}
	b, err := os.ReadFile(filepath.Join(dir, plots[0].Load))
	if err != nil || !bytes.Contains(b, []byte("<svg")) {
		t.Fatalf("%s: %v", plots[0].Load, err)
	}
	for _, want := range []string{"rr", "kv-exact", "oracle", "x1", "x4"} {
		if !bytes.Contains(b, []byte(">"+want+"<")) {
			t.Errorf("TTFT-versus-load plot does not show %q", want)
		}
	}
	var md bytes.Buffer
	WriteSweepReport(&md, "sweep", []*Sweep{sw}, plots)
	rep := md.String()
	for _, want := range []string{"## Workload: hot-prefix (test)", "| x1 p50 / p90 ms | x4 p50 / p90 ms |", "![w1-ttft-vs-load](w1-ttft-vs-load.svg)",
		"### Rate x1: 10 requests over ~2.0s", "### Rate x4: 10 requests over ~0.5s", "#### Comparison", "\n| rr | 10 | 0 | 10.0 | 10.0 | 40.0 |",
		"![w1-x4-load](w1-x4-load.svg)", "kv-exact TTFT p90 / rr TTFT p90 = 0.50"} {
		if !strings.Contains(rep, want) {
			t.Errorf("report lacks %q:\n%s", want, rep)
		}
	}
}
