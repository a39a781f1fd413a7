package route

import (
	"os/exec"
	"testing"
)

// vllmRankMetrics renders the scheduler gauges of a vLLM API server over engine cores
// with prometheus_client itself (the library vLLM's PrometheusStatLogger uses), labelled
// as vllm/v1/metrics/loggers.py labels them: ["model_name", "engine"], one child per
// core index. The Go parser never sees a body written by kvgate.
const vllmRankMetrics = `
import sys
from prometheus_client import CollectorRegistry, Gauge, generate_latest
reg = CollectorRegistry()
labels = ["model_name", "engine"]
run = Gauge("vllm:num_requests_running", "running", labelnames=labels, registry=reg)
wait = Gauge("vllm:num_requests_waiting", "waiting", labelnames=labels, registry=reg)
kv = Gauge("vllm:kv_cache_usage_perc", "kv", labelnames=labels, registry=reg)
for idx, (r, w, u) in enumerate([(3, 0, 0.25), (1, 4, 0.5), (0, 0, 0.0)]):
    run.labels(model_name="qwen3", engine=str(idx)).set(r)
    wait.labels(model_name="qwen3", engine=str(idx)).set(w)
    kv.labels(model_name="qwen3", engine=str(idx)).set(u)
sys.stdout.write(generate_latest(reg).decode())
`

func TestParseRankReportsVLLMEngineLabels(t *testing.T) {
	out, err := exec.Command("/usr/bin/python3", "-c", vllmRankMetrics).CombinedOutput()
	if err != nil {
		t.Fatalf("needs /usr/bin/python3 with python3-prometheus-client (run `make fetch`): %v\n%s", err, out)
	}
	rs, ok := ParseRankReports(out, 3)
	if !ok {
		t.Fatalf("no per-rank reports in\n%s", out)
	}
	want := []Report{{Running: 3, KVUsage: 0.25}, {Running: 1, Waiting: 4, KVUsage: 0.5}, {KVUsage: 0}}
	for i := range want {
		if rs[i] != want[i] {
			t.Errorf("rank %d: %+v, want %+v", i, rs[i], want[i])
		}
	}
	// The whole-endpoint report still adds the cores up.
	if r, ok := ParseReport(out); !ok || r.Running != 4 || r.Waiting != 4 {
		t.Errorf("endpoint report %+v %v", r, ok)
	}
	// A rank the body does not cover, or a body without engine labels, is no per-rank report.
	if _, ok := ParseRankReports(out, 4); ok {
		t.Error("4 ranks read from a 3-core body")
	}
	if _, ok := ParseRankReports([]byte("vllm:num_requests_running{model_name=\"m\"} 2\n"), 2); ok {
		t.Error("per-rank reports from a body without engine labels")
	}
	if _, ok := ParseRankReports([]byte("vllm:num_requests_running{engine=\"x\"} 2\nvllm:num_requests_running{engine=\"0\" 1\n"), 1); ok {
		t.Error("per-rank reports from malformed labels")
	}
}
