package enginesim

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// scrape parses a Prometheus text page with the Prometheus client's own parser.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Fatalf("%s: Content-Type %q", url, ct)
	}
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return fams
}

// sample returns the value of the family's one series, checking its type, its HELP and
// that it carries exactly the labels want.
func sample(t *testing.T, fams map[string]*dto.MetricFamily, name string, typ dto.MetricType, want map[string]string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("no family %s", name)
	}
	if f.GetType() != typ || f.GetHelp() == "" || len(f.Metric) != 1 {
		t.Fatalf("%s: type %v help %q series %d", name, f.GetType(), f.GetHelp(), len(f.Metric))
	}
	m := f.Metric[0]
	got := map[string]string{}
	for _, lp := range m.Label {
		got[lp.GetName()] = lp.GetValue()
	}
	if len(got) != len(want) {
		t.Errorf("%s labels %v, want %v", name, got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s label %s=%q, want %q", name, k, got[k], v)
		}
	}
	if typ == dto.MetricType_COUNTER {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

// holdRequests starts n requests that decode for a long time on a one-slot engine: one runs,
// the rest wait. The returned cancel ends them all.
func holdRequests(t *testing.T, s *Sim, n int) (cancel func()) {
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{}, n)
	for i := 0; i < n; i++ {
		go func(i int) {
			defer func() { done <- struct{}{} }()
			req, _ := http.NewRequestWithContext(ctx, "POST", s.URL()+"/v1/completions",
				strings.NewReader(`{"prompt":`+ids(1000*i, 8)+`,"max_tokens":40}`))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}(i)
	}
	return func() {
		stop()
		for i := 0; i < n; i++ {
			<-done
		}
	}
}

func waitLoad(t *testing.T, s *Sim, running, waiting int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for st := s.Stats(); st.Running != running || st.Waiting != waiting; st = s.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("load %d running %d waiting, want %d and %d", st.Running, st.Waiting, running, waiting)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func loadSpec(engine string) Spec {
	return Spec{Engine: engine, Model: "m", BlockSize: 4, NumBlocks: 64, MaxBatch: 1, DecodePerToken: time.Second}
}

func TestVLLMLoadMetricsFollowTheQueue(t *testing.T) {
	s := launch(t, loadSpec(EngineVLLM))
	lbl := map[string]string{"model_name": "m", "engine": "0"}
	complete(t, s, `{"prompt":`+ids(0, 8)+`,"max_tokens":1}`)
	complete(t, s, `{"prompt":`+ids(0, 8)+`,"max_tokens":1}`)
	f := scrape(t, s.URL()+"/metrics")
	// Two 8-token prompts, 2 blocks each: the second hits 1 block (the last one is
	// recomputed, as vLLM caps the hit at prompt-1 tokens).
	for name, want := range map[string]float64{"vllm:prompt_tokens_total": 16, "vllm:generation_tokens_total": 2,
		"vllm:prefix_cache_queries_total": 16, "vllm:prefix_cache_hits_total": 4} {
		if got := sample(t, f, name, dto.MetricType_COUNTER, lbl); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	ok := map[string]string{"model_name": "m", "engine": "0", "finished_reason": "length"}
	if got := sample(t, f, "vllm:request_success_total", dto.MetricType_COUNTER, ok); got != 2 {
		t.Errorf("request_success_total = %v", got)
	}
	if got := sample(t, f, "vllm:kv_cache_usage_perc", dto.MetricType_GAUGE, lbl); got != 0 {
		t.Errorf("idle kv_cache_usage_perc = %v", got)
	}

	release := holdRequests(t, s, 3)
	waitLoad(t, s, 1, 2)
	f = scrape(t, s.URL()+"/metrics")
	if r, w := sample(t, f, "vllm:num_requests_running", dto.MetricType_GAUGE, lbl), sample(t, f, "vllm:num_requests_waiting", dto.MetricType_GAUGE, lbl); r != 1 || w != 2 {
		t.Errorf("held: running %v waiting %v, want 1 and 2", r, w)
	}
	// The running request holds 2 prompt blocks + its output block(s) of 64.
	if u := sample(t, f, "vllm:kv_cache_usage_perc", dto.MetricType_GAUGE, lbl); u <= 0 || u > 1 {
		t.Errorf("busy kv_cache_usage_perc = %v, want in (0,1]", u)
	}
	release()
	waitLoad(t, s, 0, 0)
	f = scrape(t, s.URL()+"/metrics")
	if r, w := sample(t, f, "vllm:num_requests_running", dto.MetricType_GAUGE, lbl), sample(t, f, "vllm:num_requests_waiting", dto.MetricType_GAUGE, lbl); r != 0 || w != 0 {
		t.Errorf("released: running %v waiting %v", r, w)
	}
}

func TestSGLangLoadMetricsFollowTheQueue(t *testing.T) {
	s := launch(t, loadSpec(EngineSGLang))
	sched := map[string]string{"model_name": "m", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
	tok := map[string]string{"model_name": "m"}
	complete(t, s, `{"prompt":`+ids(0, 8)+`,"max_tokens":1}`)
	complete(t, s, `{"prompt":`+ids(0, 8)+`,"max_tokens":1}`)
	f := scrape(t, s.URL()+"/metrics")
	for name, want := range map[string]float64{"sglang:prompt_tokens_total": 16, "sglang:generation_tokens_total": 2,
		"sglang:cached_tokens_total": 4, "sglang:num_requests_total": 2} {
		if got := sample(t, f, name, dto.MetricType_COUNTER, tok); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got := sample(t, f, "sglang:max_total_num_tokens", dto.MetricType_GAUGE, sched); got != 64*4 {
		t.Errorf("max_total_num_tokens = %v", got)
	}
	if got := sample(t, f, "sglang:cache_hit_rate", dto.MetricType_GAUGE, sched); got != 4.0/16 {
		t.Errorf("cache_hit_rate = %v", got)
	}
	release := holdRequests(t, s, 3)
	waitLoad(t, s, 1, 2)
	f = scrape(t, s.URL()+"/metrics")
	if r, w := sample(t, f, "sglang:num_running_reqs", dto.MetricType_GAUGE, sched), sample(t, f, "sglang:num_queue_reqs", dto.MetricType_GAUGE, sched); r != 1 || w != 2 {
		t.Errorf("held: running %v waiting %v, want 1 and 2", r, w)
	}
	if u, n := sample(t, f, "sglang:token_usage", dto.MetricType_GAUGE, sched), sample(t, f, "sglang:num_used_tokens", dto.MetricType_GAUGE, sched); u <= 0 || n != u*64*4 {
		t.Errorf("busy token_usage %v num_used_tokens %v", u, n)
	}
	release()
	waitLoad(t, s, 0, 0)
	f = scrape(t, s.URL()+"/metrics")
	if r, w := sample(t, f, "sglang:num_running_reqs", dto.MetricType_GAUGE, sched), sample(t, f, "sglang:num_queue_reqs", dto.MetricType_GAUGE, sched); r != 0 || w != 0 {
		t.Errorf("released: running %v waiting %v", r, w)
	}
}

func trtStats(t *testing.T, s *Sim) TRTIterationStats {
	t.Helper()
	resp, err := http.Get(s.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list []map[string]any // the raw shape first: camelCase keys, a list
	dec := json.NewDecoder(resp.Body)
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &list); err != nil || len(list) != 1 {
		t.Fatalf("GET /metrics: %s (%v)", raw, err)
	}
	for _, k := range []string{"numActiveRequests", "numQueuedRequests", "numCompletedRequests", "maxNumActiveRequests", "iter", "kvCacheStats", "inflightBatchingStats"} {
		if _, ok := list[0][k]; !ok {
			t.Errorf("iteration stats lack %q: %s", k, raw)
		}
	}
	var st []TRTIterationStats
	json.Unmarshal(raw, &st)
	return st[0]
}

func TestTRTLLMLoadMetricsFollowTheQueue(t *testing.T) {
	s := launch(t, loadSpec(EngineTRTLLM))
	lbl := map[string]string{"model_name": "undefined", "engine_type": "undefined"}
	complete(t, s, `{"prompt":`+ids(0, 8)+`,"max_tokens":1}`)
	st := trtStats(t, s)
	if st.NumCompletedRequests != 1 || st.KVCacheStats.MaxNumBlocks != 64 || st.KVCacheStats.TokensPerBlock != 4 || st.MaxNumActiveRequests != 1 {
		t.Errorf("idle stats %+v", st)
	}
	if st2 := trtStats(t, s); st2.NumCompletedRequests != 0 || st2.Iter <= st.Iter {
		t.Errorf("second drain %+v: completed requests are reported once, iter grows", st2)
	}
	release := holdRequests(t, s, 3)
	waitLoad(t, s, 1, 2)
	st = trtStats(t, s)
	if st.NumActiveRequests != 1 || st.NumQueuedRequests != 2 || st.KVCacheStats.UsedNumBlocks == 0 ||
		st.InflightBatchingStats.NumGenRequests+st.InflightBatchingStats.NumContextRequests != 1 {
		t.Errorf("held stats %+v", st)
	}
	f := scrape(t, s.URL()+"/prometheus/metrics")
	if r, w := sample(t, f, "trtllm_num_requests_running", dto.MetricType_GAUGE, lbl), sample(t, f, "trtllm_num_requests_waiting", dto.MetricType_GAUGE, lbl); r != 1 || w != 2 {
		t.Errorf("held: running %v waiting %v, want 1 and 2", r, w)
	}
	if u := sample(t, f, "trtllm_kv_cache_utilization", dto.MetricType_GAUGE, lbl); u <= 0 {
		t.Errorf("kv_cache_utilization %v", u)
	}
	if p := sample(t, f, "trtllm_prompt_tokens_total", dto.MetricType_COUNTER, lbl); p != 8+8 { // the waiting two are not counted before they run
		t.Errorf("prompt_tokens_total %v", p)
	}
	release()
	waitLoad(t, s, 0, 0)
	if st = trtStats(t, s); st.NumActiveRequests != 0 || st.NumQueuedRequests != 0 {
		t.Errorf("released stats %+v", st)
	}
}

// SGLang's P/D queues: a prefill engine's computed-but-uncollected KV (inflight) and a
// decode engine's requests waiting for their KV (transfer).
func TestSGLangPDQueueMetrics(t *testing.T) {
	sp := launch(t, Spec{Engine: EngineSGLang, Role: RolePrefill, Encoder: WordEncoder{}, Model: "m", NumBlocks: 256})
	sd := launch(t, Spec{Engine: EngineSGLang, Role: RoleDecode, Encoder: WordEncoder{}, Model: "m", NumBlocks: 256, BootstrapTimeout: 10 * time.Second})
	lbl := map[string]string{"model_name": "m", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
	host, port, _ := strings.Cut(sp.BootstrapAddr(), ":")
	room := func(n string) string {
		return `,"bootstrap_host":"` + host + `","bootstrap_port":` + port + `,"bootstrap_room":` + n + `}`
	}
	gauge := func(s *Sim, name string) float64 {
		return sample(t, scrape(t, s.URL()+"/metrics"), name, dto.MetricType_GAUGE, lbl)
	}
	if code, b, _ := post(t, sp.URL()+"/v1/completions", `{"prompt":"a b c"`+room("11")); code != 200 {
		t.Fatalf("prefill: HTTP %d %s", code, b)
	}
	if n := gauge(sp, "sglang:num_prefill_inflight_queue_reqs"); n != 1 {
		t.Errorf("prefill inflight %v, want 1", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, "POST", sd.URL()+"/v1/completions", strings.NewReader(`{"prompt":"x y"`+room("12")))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for gauge(sd, "sglang:num_decode_transfer_queue_reqs") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the decode waiting for room 12 never showed in the transfer queue")
		}
		time.Sleep(2 * time.Millisecond)
	}
	cancel()
	<-done
	for gauge(sd, "sglang:num_decode_transfer_queue_reqs") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the transfer queue kept a request its client left")
		}
		time.Sleep(2 * time.Millisecond)
	}
	if code, b, _ := post(t, sd.URL()+"/v1/completions", `{"prompt":"a b c"`+room("11")); code != 200 {
		t.Fatalf("decode: HTTP %d %s", code, b)
	}
	if n := gauge(sp, "sglang:num_prefill_inflight_queue_reqs"); n != 0 {
		t.Errorf("prefill inflight after the decode collected it: %v", n)
	}
}
