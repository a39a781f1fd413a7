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
		{[]string{"-workload", "hot-prefix,rag,"}, "unknown workload"},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"-tokenizer", "words", "-out", t.TempDir()}, c.args...)
		if code := runBench(args, nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%q: exit %d, stderr %q: want 2 and a message naming %s", c.args, code, errb.String(), c.want)
		}
	}
}

// A two-level sweep of the hot-prefix and RAG workloads under the harness-only policies
// (no kvgate process): a table per level, a TTFT-versus-load table per workload, and one
// report with both workloads and their plots.
func TestBenchHotPrefixSweep(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	code := runBench([]string{"-tokenizer", "words", "-out", dir, "-progress=false", "-workload", "hot-prefix,rag", "-hot-requests", "40",
		"-docs", "4", "-doc-tokens", "30", "-queries", "20",
		"-hot-prefix-min-tokens", "50", "-hot-prefix-max-tokens", "200", "-spread", "1s", "-max-tokens", "4", "-decode-per-token", "1ms",
		"-policies", "direct-rr,oracle", "-rate-scale", "1,4"}, nil, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	so := out.String()
	for _, want := range []string{"rate x1, 40 requests over", "rate x4, 40 requests over", "| direct-rr | 40 | 0 |", "| oracle | 40 | 0 |",
		"| policy | x1 p50 / p90 ms | x4 p50 / p90 ms |", "rate x4, 20 requests over", "plots: w1-ttft-vs-load.svg, w2-ttft-vs-load.svg"} {
		if !strings.Contains(so, want) {
			t.Errorf("stdout lacks %q:\n%s", want, so)
		}
	}
	rep, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Workload: hot-prefix", "![w1-ttft-vs-load](w1-ttft-vs-load.svg)", "### Rate x4: 40 requests",
		"## Workload: RAG", "![w2-ttft-vs-load](w2-ttft-vs-load.svg)", "### Rate x4: 20 requests"} {
		if !strings.Contains(string(rep), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, f := range []string{"w1-x4-ttft-cdf.svg", "w2-x1-load.svg"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
}
