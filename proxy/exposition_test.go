package proxy

import (
	"bufio"
	"bytes"
	"io"
	"math"
	"net/http"
	"runtime"
	rtmetrics "runtime/metrics"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/kvgate/kvgate/bench/enginepub"
)

// scrapeFamilies parses /metrics with the Prometheus text parser (an independent
// reader: it refuses a family written twice, samples without metadata of their own
// family, and malformed histograms), and checks every family has HELP and TYPE.
func scrapeFamilies(t *testing.T, s *Server) map[string]*dto.MetricFamily {
	t.Helper()
	res, err := httpc.Get(s.admURL("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("Prometheus text parser refused /metrics: %v", err)
	}
	// The parser accepts a family without metadata: check every sample's family has
	// its own # HELP (non-empty text) and # TYPE lines, once.
	help, typ := map[string]int{}, map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 3 && f[0] == "#" && f[1] == "HELP" {
			help[f[2]]++
			if len(f) < 4 || strings.HasSuffix(sc.Text(), "(undocumented)") {
				t.Errorf("family %s has no help text", f[2])
			}
		}
		if len(f) >= 4 && f[0] == "#" && f[1] == "TYPE" {
			typ[f[2]]++
		}
	}
	for name := range fams {
		if help[name] != 1 || typ[name] != 1 {
			t.Errorf("family %s: %d HELP and %d TYPE lines, want 1 each", name, help[name], typ[name])
		}
	}
	return fams
}

// checkHistograms: every histogram's buckets are cumulative, in rising le order, end in
// +Inf, and +Inf equals the sample count.
func checkHistograms(t *testing.T, fams map[string]*dto.MetricFamily) {
	t.Helper()
	for name, f := range fams {
		if f.GetType() != dto.MetricType_HISTOGRAM {
			continue
		}
		for _, m := range f.Metric {
			h := m.GetHistogram()
			bs := h.GetBucket()
			if len(bs) == 0 {
				t.Errorf("%s: no buckets", name)
				continue
			}
			for i := 1; i < len(bs); i++ {
				if bs[i].GetUpperBound() <= bs[i-1].GetUpperBound() || bs[i].GetCumulativeCount() < bs[i-1].GetCumulativeCount() {
					t.Errorf("%s: buckets not cumulative in rising le at %d", name, i)
				}
			}
			last := bs[len(bs)-1]
			if !math.IsInf(last.GetUpperBound(), 1) || last.GetCumulativeCount() != h.GetSampleCount() {
				t.Errorf("%s: last bucket le=%v count %d, want +Inf and the sample count %d", name, last.GetUpperBound(), last.GetCumulativeCount(), h.GetSampleCount())
			}
		}
	}
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.Label {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// find returns the series of family name whose labels include want.
func find(fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	f := fams[name]
	if f == nil {
		return nil
	}
next:
	for _, m := range f.Metric {
		l := labelsOf(m)
		for k, v := range want {
			if l[k] != v {
				continue next
			}
		}
		return m
	}
	return nil
}

// /metrics parses as Prometheus text with HELP and TYPE on every family, histograms
// with le buckets, and the answer families (duration, TTFT, status code) count exactly
// the requests sent, per endpoint and route; KV-Exact's families (ingest included)
// appear once each.
func TestMetricsPrometheusExposition(t *testing.T) {
	c := vllmChain(t)
	a := newKVEngine(t, "a", enginepub.VLLM)
	cfg := kvConfig(t, KVConverged, a.spec(0, "vllm", ""))
	cfg.KV.PendingTTL = 0 // the repeated miss would follow its own pending entries
	s := startProxy(t, cfg)
	a.store(t, c, engineTokens(t, sharedPrefix), 8)
	waitFor(t, "events applied", func() bool { return s.kv.inv.Count(0) == 8 })
	const hits, misses = 3, 2
	for i := 0; i < hits; i++ {
		if res, _ := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix)); res.Header.Get("x-kvgate-route") != "kv-hit" {
			t.Fatalf("route %s", res.Header.Get("x-kvgate-route"))
		}
	}
	for i := 0; i < misses; i++ {
		post(t, s.url("/v1/completions"), complPrompt("an uncached prompt "+strings.Repeat("x ", 40)))
	}
	fams := scrapeFamilies(t, s)
	checkHistograms(t, fams)
	for _, fam := range []string{"kvgate_request_duration_seconds", "kvgate_ttft_seconds"} {
		h := find(fams, fam, map[string]string{"endpoint": "a", "route": "kv-hit"})
		if h == nil || h.GetHistogram().GetSampleCount() != hits {
			t.Errorf("%s{a,kv-hit}: %v, want %d samples", fam, h, hits)
		}
		h = find(fams, fam, map[string]string{"endpoint": "a", "route": "kv-miss:no_worker"})
		if h == nil || h.GetHistogram().GetSampleCount() != misses {
			t.Errorf("%s{a,kv-miss:no_worker}: %v, want %d samples", fam, h, misses)
		}
	}
	if m := find(fams, "kvgate_responses_total", map[string]string{"endpoint": "a", "route": "kv-hit", "code": "200"}); m == nil || m.GetCounter().GetValue() != hits {
		t.Errorf("responses_total{a,kv-hit,200}: %v", m)
	}
	if fams["kvgate_route_seconds"].GetType() != dto.MetricType_HISTOGRAM ||
		fams["kvgate_route_seconds"].Metric[0].GetHistogram().GetSampleCount() != hits+misses {
		t.Errorf("route_seconds: %v", fams["kvgate_route_seconds"])
	}
	// The gauges once written twice under two names are one family each now.
	for _, gone := range []string{"kvgate_inventory_keys", "kvgate_events_connected"} {
		if fams[gone] != nil {
			t.Errorf("%s duplicates an ingest gauge", gone)
		}
	}
	for _, kept := range []string{"kvgate_ingest_inventory_keys", "kvgate_ingest_connected", "kvgate_routing_state", "kvgate_ready"} {
		if fams[kept] == nil {
			t.Errorf("%s missing", kept)
		}
	}
}

// Answers with other codes count under their own code, the relayed endpoint and route.
func TestMetricsStatusCodes(t *testing.T) {
	a := newFakeEngine(t, "a")
	a.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		switch {
		case strings.Contains(string(body), "teapot"):
			w.WriteHeader(418)
		case strings.Contains(string(body), "limit"):
			w.WriteHeader(429)
		default:
			return false
		}
		return true
	}
	s := startProxy(t, testConfig(a.url()))
	post(t, s.url("/v1/completions"), `{"model":"m","prompt":"teapot"}`)
	post(t, s.url("/v1/completions"), `{"model":"m","prompt":"limit"}`)
	post(t, s.url("/v1/completions"), `{"model":"m","prompt":"limit"}`)
	post(t, s.url("/v1/completions"), complBody)
	fams := scrapeFamilies(t, s)
	checkHistograms(t, fams)
	for code, n := range map[string]float64{"4xx": 1, "429": 2, "200": 1} {
		m := find(fams, "kvgate_responses_total", map[string]string{"endpoint": "e0", "route": "rr", "code": code})
		if m == nil || m.GetCounter().GetValue() != n {
			t.Errorf("responses_total{code=%s} = %v, want %v", code, m, n)
		}
	}
}

// -access-log: one INFO line per answered request with the decision and its receipt;
// none without the flag.
func TestAccessLog(t *testing.T) {
	a := newFakeEngine(t, "a")
	cfg := testConfig(a.url())
	cfg.Listener.AccessLog = true
	s, lb := startLogged(t, cfg, nil)
	post(t, s.url("/v1/completions"), complBody, "X-Request-Id", "req-42")
	post(t, s.url("/v1/chat/completions"), `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if l := lb.lines("level=INFO", "msg=request", "request_id=req-42", "path=/v1/completions", "endpoint=e0", "route=rr",
		"status=200", "predicted_cached_tokens=0", "delivered_cached_tokens=32", "ttft_ms=", "duration_ms="); len(l) != 1 {
		t.Errorf("access log line for the completion: %q", lb.String())
	}
	if l := lb.lines("msg=request", "path=/v1/chat/completions", "status=200"); len(l) != 1 {
		t.Errorf("access log line for the stream: %q", lb.String())
	}
	cfg.Listener.AccessLog = false
	s2, lb2 := startLogged(t, cfg, nil)
	post(t, s2.url("/v1/completions"), complBody)
	if l := lb2.lines("msg=request"); len(l) != 0 {
		t.Errorf("access log without -access-log: %q", l)
	}
}

// observeRequest allocates nothing once an {endpoint, route, code} series exists (it
// runs once per answer).
func TestObserveRequestAllocs(t *testing.T) {
	m := newProxyMetrics([]string{"a", "b"})
	m.observeRequest(1, RouteKVHit, 200, 3*time.Millisecond, time.Millisecond)
	if n := testing.AllocsPerRun(200, func() {
		m.observeRequest(1, RouteKVHit, 200, 3*time.Millisecond, time.Millisecond)
	}); n != 0 {
		t.Errorf("%v allocs per observed request", n)
	}
}

// The runtime's scheduling-latency and GC-pause histograms are exposed whole (buckets,
// _sum, _count) with their count equal to the runtime's own sample count at the time:
// the fold into fixed bounds loses no sample.
func TestMetricsRuntimeHistograms(t *testing.T) {
	a := newFakeEngine(t, "a")
	s := startProxy(t, testConfig(a.url()))
	runtime.GC() // at least one GC pause
	fams := scrapeFamilies(t, s)
	checkHistograms(t, fams)
	for _, h := range runtimeHists {
		f := fams[h.family]
		if f == nil || f.GetType() != dto.MetricType_HISTOGRAM || len(f.Metric) != 1 {
			t.Fatalf("%s: %v", h.family, f)
		}
		got := f.Metric[0].GetHistogram()
		s := []rtmetrics.Sample{{Name: h.sample}}
		rtmetrics.Read(s)
		var n uint64
		for _, c := range s[0].Value.Float64Histogram().Counts {
			n += c
		}
		// Read after the scrape: the runtime's count can only have grown since.
		if got.GetSampleCount() == 0 || got.GetSampleCount() > n {
			t.Errorf("%s: %d samples exposed, runtime has %d", h.family, got.GetSampleCount(), n)
		}
		if len(got.GetBucket()) != len(runtimeHistBounds)+1 {
			t.Errorf("%s: %d buckets", h.family, len(got.GetBucket()))
		}
	}
}
