package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Bad sweep, replica and hot-prefix flags are refused before anything starts, with a
// message naming the flag.
func TestBenchRejectsBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-rate-scale", "1,0"}, "-rate-scale"},
		{[]string{"-rate-scale", "fast"}, "-rate-scale"},
		{[]string{"-replicas", "0"}, "-replicas"},
		{[]string{"-workload", "hot-prefix", "-zipf", "-1"}, "-zipf"},
		{[]string{"-workload", "hot-prefix", "-hot-prefix-min-tokens", "500", "-hot-prefix-max-tokens", "100"}, "-hot-prefix-min-tokens"},
		{[]string{"-workload", "hot"}, "unknown workload"},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"-tokenizer", "words", "-out", t.TempDir()}, c.args...)
		if code := runBench(args, nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%q: exit %d, stderr %q: want 2 and a message naming %s", c.args, code, errb.String(), c.want)
		}
	}
}

// A two-level sweep of the hot-prefix workload under the harness-only policies (no kvgate
// process): a table per level, the TTFT-versus-load table, and the report with its plot.
func TestBenchHotPrefixSweep(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	code := runBench([]string{"-tokenizer", "words", "-out", dir, "-progress=false", "-workload", "hot-prefix", "-hot-requests", "40",
		"-hot-prefix-min-tokens", "50", "-hot-prefix-max-tokens", "200", "-spread", "1s", "-max-tokens", "4", "-decode-per-token", "1ms",
		"-policies", "direct-rr,oracle", "-rate-scale", "1,4"}, nil, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	so := out.String()
	for _, want := range []string{"rate x1, 40 requests over", "rate x4, 40 requests over", "| direct-rr | 40 | 0 |", "| oracle | 40 | 0 |",
		"| policy | x1 p50 / p90 ms | x4 p50 / p90 ms |", "plots: w1-ttft-vs-load.svg"} {
		if !strings.Contains(so, want) {
			t.Errorf("stdout lacks %q:\n%s", want, so)
		}
	}
	rep, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Workload: hot-prefix", "![w1-ttft-vs-load](w1-ttft-vs-load.svg)", "### Rate x4: 40 requests"} {
		if !strings.Contains(string(rep), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "w1-x4-ttft-cdf.svg")); err != nil {
		t.Error(err)
	}
}
