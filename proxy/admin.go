package proxy

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/kvgate/kvgate/proxy/openai"
	"github.com/kvgate/kvgate/proxy/route"
)

// adminHandler serves the admin listener: metrics, pprof, inventory, explain, health,
// readiness and the endpoint down/up switches. pprof is never on the public listener.
func (s *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", s.serveMetrics)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/debug/inventory", s.serveInventory)
	mux.HandleFunc("/debug/explain", s.serveExplain)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/readyz", s.serveReady)
	mux.HandleFunc("POST /admin/endpoints/{name}/{op}", s.serveAdminState)
	if s.cfg.AdminToken == "" {
		return mux
	}
	want := []byte("Bearer " + s.cfg.AdminToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" && r.URL.Path != "/readyz" &&
			subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	s.m.set.WritePrometheus(w)
	for i, e := range s.eps {
		lbl := fmt.Sprintf(`{endpoint=%q}`, e.spec.Name)
		metrics.WriteGaugeUint64(w, "kvgate_inflight_requests"+lbl, uint64(max(s.loads.Get(i), 0)))
		metrics.WriteGaugeUint64(w, "kvgate_breaker_state"+lbl, uint64(e.breaker.State()))
		metrics.WriteGaugeUint64(w, "kvgate_endpoint_up"+lbl, b2u(e.healthy.Load() && !e.down.Load()))
		metrics.WriteGaugeUint64(w, "kvgate_endpoint_admin_down"+lbl, b2u(e.down.Load()))
		if s.kv != nil {
			keys, _, connected, _ := s.kv.inventory(i)
			metrics.WriteGaugeUint64(w, "kvgate_inventory_keys"+lbl, uint64(keys))
			metrics.WriteGaugeUint64(w, "kvgate_events_connected"+lbl, b2u(connected))
		}
	}
	if s.kv != nil {
		// Memory the rule holds beside the process totals: the inventory (bounded per
		// endpoint by the shard's key bound) and each loaded tokenizer.
		metrics.WriteGaugeUint64(w, "kvgate_inventory_memory_bytes", uint64(max(s.kv.inv.MemoryBytes(), 0)))
		st := s.kv.inv.Stats()
		metrics.WriteGaugeUint64(w, "kvgate_inventory_unique_keys", uint64(max(st.Keys, 0)))
		metrics.WriteGaugeUint64(w, "kvgate_inventory_slots", uint64(max(st.Slots, 0)))
		metrics.WriteGaugeUint64(w, "kvgate_inventory_tombstones", uint64(max(st.Tombstones, 0)))
		metrics.WriteGaugeUint64(w, "kvgate_inventory_max_keys_per_endpoint", uint64(max(st.MaxKeysPerEndpoint, 0)))
		metrics.WriteCounterUint64(w, "kvgate_inventory_evicted_total", st.EvictedAtBound)
		metrics.WriteCounterUint64(w, "kvgate_inventory_dropped_total", st.DroppedAtBound)
		metrics.WriteCounterUint64(w, "kvgate_inventory_rebuilds_total", st.Rebuilds)
		if t := s.kv.trie; t != nil {
			keys, bytes := t.stats()
			metrics.WriteGaugeUint64(w, "kvgate_prefix_trie_keys", uint64(max(keys, 0)))
			metrics.WriteGaugeUint64(w, "kvgate_prefix_trie_memory_bytes", uint64(max(bytes, 0)))
		}
		for _, t := range s.cfg.Tokenizers {
			if m := s.kv.pool.Get(t.Model); m != nil {
				metrics.WriteGaugeUint64(w, fmt.Sprintf(`kvgate_tokenizer_memory_bytes{model=%q}`, t.Model),
					uint64(max(m.Tokenizer().MemoryBytes(), 0)))
			}
		}
	}
	metrics.WriteGaugeUint64(w, "kvgate_affinity_sessions", uint64(s.aff.len()))
	metrics.WriteProcessMetrics(w)
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

type inventoryEndpoint struct {
	Name      string `json:"name"`
	URL       string `json:"url"`
	Engine    string `json:"engine"`
	Role      string `json:"role"`
	Keys      int    `json:"keys"`
	Parity    string `json:"parity"`
	Connected bool   `json:"connected"`
	LastSeq   int64  `json:"last_seq"`
	Breaker   string `json:"breaker"`
	Healthy   bool   `json:"healthy"`
	Down      bool   `json:"down"`
	InFlight  int64  `json:"in_flight"`
	Predicted uint64 `json:"predicted_cached_tokens"`
	Delivered uint64 `json:"delivered_cached_tokens"`
	Receipts  uint64 `json:"receipts"`
	KVHits    uint64 `json:"kv_hits"`
	Delivery  string `json:"delivery"`
	// Plane is the endpoint's event-plane state (route: ok / syncing / degraded and why).
	Plane string `json:"plane,omitempty"`
	// Load is the cost policy's view: queued prefill, learned rate, the engine's report.
	Load *route.EndpointView `json:"load,omitempty"`
	// Scrape is how reading the engine's /metrics goes ("off" when -kv-load-scrape is 0).
	Scrape *scrapeView `json:"scrape,omitempty"`
}

type scrapeView struct {
	OK        uint64  `json:"ok"`
	Failed    uint64  `json:"failed"`
	Failing   bool    `json:"failing"`
	LastError string  `json:"last_error,omitempty"`
	LastMs    float64 `json:"last_ms"`
}

// deliveryNote reads the receipts: engines reporting far fewer cached tokens than
// kvgate predicted means kvgate tokenizes, templates or hashes differently.
func deliveryNote(receipts, predicted, delivered uint64) string {
	switch {
	case receipts == 0:
		return "no receipts yet (non-streamed responses carry usage; streams need stream_options.include_usage)"
	case predicted < 256:
		return "too little predicted to judge"
	case float64(delivered) < 0.5*float64(predicted):
		return "gap: engines deliver far fewer cached tokens than predicted; tokenizer, chat template or hash settings likely differ from the engine's"
	}
	return "ok"
}

func (s *Server) serveInventory(w http.ResponseWriter, r *http.Request) {
	out := struct {
		Endpoints []inventoryEndpoint `json:"endpoints"`
	}{Endpoints: []inventoryEndpoint{}}
	for i, e := range s.eps {
		ie := inventoryEndpoint{
			Name: e.spec.Name, URL: e.spec.URL, Engine: e.spec.Engine.String(), Role: e.spec.Role.String(),
			Parity: "unknown", LastSeq: -1, Breaker: e.breaker.State().String(),
			Healthy: e.healthy.Load(), Down: e.down.Load(), InFlight: s.loads.Get(i),
			Predicted: s.m.predicted[i].Get(), Delivered: s.m.delivered[i].Get(),
			Receipts: s.m.receipts[i].Get(), KVHits: s.m.hits[i].Get(),
		}
		ie.Delivery = deliveryNote(ie.Receipts, ie.Predicted, ie.Delivered)
		if s.kv != nil {
			ie.Keys, ie.Parity, ie.Connected, ie.LastSeq = s.kv.inventory(i)
			ie.Plane = s.kv.planeState(i)
			v := s.queues.View(i, time.Now())
			ie.Load = &v
			if s.cfg.KVLoadScrape > 0 {
				sc := &scrapeView{OK: e.scrape.ok.Load(), Failed: e.scrape.failed.Load(),
					Failing: e.scrape.failing.Load(), LastMs: float64(e.scrape.duration.Load()) / 1e6}
				if p := e.scrape.lastErr.Load(); p != nil && sc.Failing {
					sc.LastError = *p
				}
				ie.Scrape = sc
			}
		}
		out.Endpoints = append(out.Endpoints, ie)
	}
	writeJSON(w, 200, out)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v) //nolint:errcheck
}

func writeHTTPError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(appendErrorBody(nil, status, typ, msg)) //nolint:errcheck
}

// Explanation is /debug/explain's answer: why a request would go where, without
// sending anything upstream.
type Explanation struct {
	Tokens   int             `json:"tokens"`
	Blocks   int             `json:"blocks"`
	Scores   map[string]int  `json:"scores"`
	Eligible map[string]bool `json:"eligible"`
	Endpoint string          `json:"endpoint"`
	Route    string          `json:"route"`
	Decode   string          `json:"decode,omitempty"`
	// Policy is -kv-policy; Terms are each endpoint's inputs to it (cost: queued,
	// uncached, rate, predicted ms), recorded by the decision traffic runs.
	Policy string                 `json:"policy,omitempty"`
	Terms  map[string]route.Terms `json:"terms,omitempty"`
}

// explainTerms is the Observer /debug/explain hands the selector.
type explainTerms struct {
	names []string
	terms map[string]route.Terms
}

func (e *explainTerms) Endpoint(ep int, t route.Terms) { e.terms[e.names[ep]] = t }

func (s *Server) serveExplain(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeHTTPError(w, 405, "invalid_request_error", "POST an OpenAI completions or chat body")
		return
	}
	st := s.getState()
	defer s.putState(st)
	body, err := io.ReadAll(io.LimitReader(r.Body, int64(s.cfg.MaxBodyBytes)+1))
	if err != nil {
		writeHTTPError(w, 400, "invalid_request_error", "reading body: "+err.Error())
		return
	}
	if len(body) > s.cfg.MaxBodyBytes {
		writeHTTPError(w, 413, "invalid_request_error", "request body exceeds the limit")
		return
	}
	st.body = append(st.body[:0], body...)
	if err := openai.Scan(st.body, &st.oa); err != nil {
		writeHTTPError(w, 400, "invalid_request_error", "malformed request body: "+err.Error())
		return
	}
	st.chat = st.oa.Value[openai.FMessages].Present() || strings.Contains(r.URL.Query().Get("path"), "chat")
	ex := Explanation{Scores: map[string]int{}, Eligible: map[string]bool{}}
	var d decision
	d.ep, d.decode = -1, -1
	obs := &explainTerms{names: s.names, terms: map[string]route.Terms{}}
	st.obs = obs
	defer func() { st.obs = nil }()
	if s.kv != nil {
		ex.Policy, ex.Terms = s.kv.sel.Name(), obs.terms
	}
	if s.cfg.KVMode == KVDisaggregated {
		st.sessKey = append(st.sessKey[:0], sessionKey(nil, st)...)
		s.decidePD(st, &d)
	} else {
		el := s.baseEligible(st, st.eligible, nil)
		if s.kv != nil {
			ex.Tokens, ex.Blocks = s.kv.explain(st, el, &d)
		}
		if d.ep < 0 {
			s.decideFallback(st, &d, el, nil)
		}
	}
	for i, e := range s.eps {
		ex.Eligible[e.spec.Name] = st.eligible.Has(i)
		if s.kv != nil {
			ex.Scores[e.spec.Name] = int(st.scores[i])
		}
	}
	if s.kv != nil && s.cfg.KVMode == KVDisaggregated {
		ex.Tokens, ex.Blocks = len(st.tokens), len(st.keys)
	}
	ex.Route = d.route.String()
	if d.ep >= 0 {
		ex.Endpoint = s.eps[d.ep].spec.Name
	}
	if d.decode >= 0 {
		ex.Decode = s.eps[d.decode].spec.Name
	}
	writeJSON(w, 200, ex)
}

func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	if s.kv != nil && !s.kv.loaded() {
		http.Error(w, "tokenizers not loaded\n", http.StatusServiceUnavailable)
		return
	}
	for _, e := range s.eps {
		if e.healthy.Load() && !e.down.Load() && (s.cfg.HealthInterval == 0 || e.checked.Load()) {
			io.WriteString(w, "ready\n")
			return
		}
	}
	http.Error(w, "no healthy endpoint\n", http.StatusServiceUnavailable)
}

func (s *Server) serveAdminState(w http.ResponseWriter, r *http.Request) {
	name, op := r.PathValue("name"), r.PathValue("op")
	if op != "down" && op != "up" {
		writeHTTPError(w, 404, "not_found", "want /admin/endpoints/{name}/down or /up")
		return
	}
	for _, e := range s.eps {
		if e.spec.Name == name {
			e.down.Store(op == "down")
			s.log.Warn("endpoint administrative state changed", "endpoint", name, "down", op == "down")
			writeJSON(w, 200, map[string]any{"endpoint": name, "down": op == "down"})
			return
		}
	}
	writeHTTPError(w, 404, "not_found", "no endpoint named "+name)
}
