package route

import "testing"

func TestParseReportVLLM(t *testing.T) {
	body := []byte(`# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen3"} 3.0
vllm:num_requests_running{engine="1",model_name="qwen3"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen3"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="qwen3"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="qwen3"} 0.5
vllm:num_requests_running_total 99
vllm:prompt_tokens_total{model_name="qwen3"} 1.2e+06
`)
	r, ok := ParseReport(body)
	if !ok || r.Running != 5 || r.Waiting != 7 || r.KVUsage != 0.5 {
		t.Fatalf("%+v %v", r, ok)
	}
}

func TestParseReportSGLang(t *testing.T) {
	body := []byte("sglang:num_running_reqs{model_name=\"m\"} 4\nsglang:num_queue_reqs{model_name=\"m\"} 1\nsglang:token_usage{model_name=\"m\"} 0.75\n")
	r, ok := ParseReport(body)
	if !ok || r.Running != 4 || r.Waiting != 1 || r.KVUsage != 0.75 {
		t.Fatalf("%+v %v", r, ok)
	}
}

func TestParseReportTRT(t *testing.T) {
	body := []byte(`[{"iter":1,"numActiveRequests":1,"numQueuedRequests":0},{"iter":2,"numActiveRequests":6,"numQueuedRequests":2,"maxNumActiveRequests":64,"kvCacheStats":{"maxNumBlocks":1000,"usedNumBlocks":250}}]`)
	r, ok := ParseReport(body)
	if !ok || r.Running != 6 || r.Waiting != 2 || r.KVUsage != 0.25 || r.Slots != 64 {
		t.Fatalf("%+v %v", r, ok)
	}
	// No iteration since the last read: idle.
	if r, ok := ParseReport([]byte("[]")); !ok || r.Running != 0 || r.Waiting != 0 {
		t.Fatalf("empty list: %+v %v", r, ok)
	}
	// trtllm-serve's Prometheus route (return_perf_metrics).
	prom := []byte("trtllm_num_requests_running{model_name=\"undefined\",engine_type=\"undefined\"} 3\ntrtllm_num_requests_waiting{model_name=\"undefined\",engine_type=\"undefined\"} 1\ntrtllm_kv_cache_utilization{model_name=\"undefined\",engine_type=\"undefined\"} 0.5\n")
	if r, ok := ParseReport(prom); !ok || r.Running != 3 || r.Waiting != 1 || r.KVUsage != 0.5 {
		t.Fatalf("prometheus route: %+v %v", r, ok)
	}
}

func TestParseReportGarbage(t *testing.T) {
	for _, b := range []string{"", "garbage\x00\xff", "<html>oops</html>", "[1,2", `{"x":1}`,
		"vllm:num_requests_running{ 3", "vllm:num_requests_running NaN", "vllm:num_requests_running -4",
		"vllm:kv_cache_usage_perc 0.4"} {
		if r, ok := ParseReport([]byte(b)); ok {
			t.Errorf("%q: parsed as %+v", b, r)
		}
	}
}

func FuzzParseReport(f *testing.F) {
	f.Add([]byte("vllm:num_requests_running{a=\"b\"} 3\n"))
	f.Add([]byte(`[{"numActiveRequests":1}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, ok := ParseReport(b)
		if ok && (r.Running < 0 || r.Waiting < 0) {
			t.Fatalf("negative counts %+v", r)
		}
	})
}
