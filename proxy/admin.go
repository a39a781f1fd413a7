package proxy

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/pprof"
	"strconv"
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
	mux.HandleFunc("POST /admin/endpoints", s.serveAdminAdd)
	mux.HandleFunc("DELETE /admin/endpoints/{name}", s.serveAdminRemove)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		want := *s.adminAuth.Load() // "Bearer <token>"; "" when no token is set (SIGHUP may set one)
		if want != "" && r.URL.Path != "/healthz" && r.URL.Path != "/readyz" &&
			subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte(want)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kvgate-admin"`)
			writeHTTPError(w, http.StatusUnauthorized, "invalid_request_error", "missing or invalid admin token (want Authorization: Bearer <token>)")
			return
		}
		if _, pattern := mux.Handler(r); pattern == "" {
			w = &jsonRefusal{ResponseWriter: w} // the mux answers itself: no route, or not this method
		}
		mux.ServeHTTP(w, r)
	})
}

// jsonRefusal turns the mux's own plain-text refusal (404: no route; 405: a route that
// takes another method) into the OpenAI error shape of every other admin error.
type jsonRefusal struct {
	http.ResponseWriter
	refused bool
}

func (j *jsonRefusal) WriteHeader(code int) {
	if j.refused {
		return
	}
	if code < 400 {
		j.ResponseWriter.WriteHeader(code) // a redirect to the canonical path
		return
	}
	j.refused = true
	msg := "no admin route at this path"
	if code == http.StatusMethodNotAllowed {
		msg = "this admin route does not take this method (Allow: " + j.Header().Get("Allow") + ")"
	}
	writeHTTPError(j.ResponseWriter, code, "invalid_request_error", msg)
}

func (j *jsonRefusal) Write(b []byte) (int, error) {
	if j.refused {
		return len(b), nil // the mux's text, replaced
	}
	return j.ResponseWriter.Write(b)
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	var buf bytes.Buffer
	s.m.set.WritePrometheus(&buf)
	f := famWriter{&buf}
	// Endpoints in the fleet: a retired one (draining) may share its name with its
	// replacement, and a series is written once.
	ros := s.roster()
	var idx []int
	lbl := make([]string, len(ros.eps))
	for i, e := range ros.eps {
		if !e.retired.Load() {
			idx = append(idx, i)
			lbl[i] = "endpoint=" + strconv.Quote(e.spec.Name)
		}
	}
	perEndpoint := func(name, typ string, v func(i int, e *endpoint) uint64) {
		f.family(name, typ)
		for _, i := range idx {
			f.sample(name, lbl[i], v(i, ros.eps[i]))
		}
	}
	s.reloadRefused(f)
	perEndpoint("kvgate_inflight_requests", "gauge", func(i int, e *endpoint) uint64 { return uint64(max(s.loads.Get(i), 0)) })
	perEndpoint("kvgate_breaker_state", "gauge", func(i int, e *endpoint) uint64 { return uint64(e.breaker.State()) })
	perEndpoint("kvgate_endpoint_up", "gauge", func(i int, e *endpoint) uint64 { return b2u(e.healthy.Load() && !e.down.Load()) })
	perEndpoint("kvgate_endpoint_admin_down", "gauge", func(i int, e *endpoint) uint64 { return b2u(e.down.Load()) })
	f.family("kvgate_routing_state", "gauge")
	for _, i := range idx {
		cur, _ := s.states.state(i)
		for st := RoutingState(0); st < numStates; st++ {
			f.sample("kvgate_routing_state", lbl[i]+`,state="`+st.String()+`"`, b2u(cur == st))
		}
	}
	if s.kv != nil {
		f.family("kvgate_routing_degraded", "gauge")
		for _, i := range idx {
			_, reasons := s.states.state(i)
			for r := DegradedReason(0); r < numReasons; r++ {
				f.sample("kvgate_routing_degraded", lbl[i]+`,reason="`+r.String()+`"`, b2u(reasons&(1<<r) != 0))
			}
		}
		f.gauge("kvgate_kv_zero_hit_alarm", b2u(s.states.zeroHitWarned.Load()))
		// Memory the rule holds beside the process totals: the inventory (bounded per
		// endpoint by the shard's key bound) and each loaded tokenizer.
		f.gauge("kvgate_inventory_memory_bytes", uint64(max(s.kv.inv.MemoryBytes(), 0)))
		st := s.kv.inv.Stats()
		f.gauge("kvgate_inventory_unique_keys", uint64(max(st.Keys, 0)))
		f.gauge("kvgate_inventory_slots", uint64(max(st.Slots, 0)))
		f.gauge("kvgate_inventory_tombstones", uint64(max(st.Tombstones, 0)))
		f.gauge("kvgate_inventory_max_keys_per_endpoint", uint64(max(st.MaxKeysPerEndpoint, 0)))
		f.counter("kvgate_inventory_evicted_total", st.EvictedAtBound)
		f.counter("kvgate_inventory_dropped_total", st.DroppedAtBound)
		f.counter("kvgate_inventory_rebuilds_total", st.Rebuilds)
		f.counter("kvgate_inventory_compactions_dropped_total", st.CompactionsDropped)
		if m := s.kv.memo; m != nil {
			ms := m.Stats()
			f.counter("kvgate_tokenize_memo_hits_total", ms.Hits)
			f.counter("kvgate_tokenize_memo_misses_total", ms.Misses)
			f.counter("kvgate_tokenize_memo_notes_total", ms.Notes)
			f.counter("kvgate_tokenize_memo_evictions_total", ms.Evictions)
			f.gauge("kvgate_tokenize_memo_bytes", uint64(max(ms.Bytes, 0)))
		}
		if m := s.kv.render; m != nil {
			ms := m.Stats()
			f.counter("kvgate_render_memo_hits_total", ms.Hits)
			f.counter("kvgate_render_memo_misses_total", ms.Misses)
			f.counter("kvgate_render_memo_evictions_total", ms.Evictions)
			f.gauge("kvgate_render_memo_bytes", uint64(max(ms.Bytes, 0)))
		}
		if m := s.kv.chainMemo; m != nil {
			ms := m.Stats()
			f.counter("kvgate_chain_memo_hit_blocks_total", ms.Hits)
			f.counter("kvgate_chain_memo_miss_blocks_total", ms.Misses)
			f.counter("kvgate_chain_memo_evictions_total", ms.Evictions)
			f.gauge("kvgate_chain_memo_bytes", uint64(max(ms.Bytes, 0)))
		}
		if s.cfg.KV.LoadScrape > 0 {
			perEndpoint("kvgate_engine_load_scrape_errors_total", "counter", func(i int, e *endpoint) uint64 { return e.scrape.failed.Load() })
			perEndpoint("kvgate_engine_load_report_fresh", "gauge", func(i int, e *endpoint) uint64 { return b2u(s.queues.Fresh(i, time.Now())) })
		}
		if t := s.kv.trie; t != nil {
			keys, bytes := t.stats()
			f.gauge("kvgate_prefix_trie_keys", uint64(max(keys, 0)))
			f.gauge("kvgate_prefix_trie_memory_bytes", uint64(max(bytes, 0)))
		}
		f.family("kvgate_tokenizer_memory_bytes", "gauge")
		for _, t := range s.cfg.Models.Tokenizers {
			if m := s.kv.pool.Get(t.Model); m != nil {
				f.sample("kvgate_tokenizer_memory_bytes", "model="+strconv.Quote(t.Model), uint64(max(m.Tokenizer().MemoryBytes(), 0)))
			}
		}
	}
	f.gauge("kvgate_affinity_sessions", uint64(s.aff.len()))
	fv := s.fleet.view()
	f.gauge("kvgate_fleet_slots_free", uint64(fv.Free))
	f.gauge("kvgate_fleet_endpoints_draining", uint64(fv.Draining))
	f.gauge("kvgate_fleet_change_refused", b2u(fv.LastRefused != ""))
	ready, _ := s.readiness()
	f.gauge("kvgate_ready", b2u(ready))
	metrics.WriteProcessMetrics(&buf)
	withHelp(w, buf.Bytes())
	writeRuntimeHists(w)
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

type inventoryEndpoint struct {
	Name string `json:"name"`
	// Slot is the endpoint's index in the slot table; Draining: removed from the fleet,
	// finishing its in-flight requests before its slot is freed.
	Slot      int    `json:"slot"`
	Draining  bool   `json:"draining,omitempty"`
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
	// Routing is off, exact or degraded; Reasons and Why say what degrades it.
	Routing string   `json:"routing"`
	Reasons []string `json:"degraded_reasons"`
	Why     string   `json:"routing_why"`
	// Plane is the endpoint's event-plane state (route: ok / syncing / degraded and why).
	Plane string `json:"plane,omitempty"`
	// Load is the cost policy's view: queued prefill, learned rate, the engine's report.
	Load *route.EndpointView `json:"load,omitempty"`
	// Scrape is how reading the engine's /metrics goes (absent when -kv-load-scrape is 0).
	Scrape *scrapeView `json:"scrape,omitempty"`
	// Ranks are a data-parallel endpoint's ranks, each its own engine core and cache:
	// the keys it holds and the policy's view of its queue (absent with one rank).
	Ranks []rankInventory `json:"ranks,omitempty"`
	// Keying is the contract and block size kvgate keys the endpoint with, and what its
	// events prove (absent without KV-Exact).
	Keying *keyingView `json:"keying,omitempty"`
}

type keyingView struct {
	Contract  string `json:"contract,omitempty"`
	BlockSize int    `json:"block_size"`
	// Source: "endpoint" (its block_size option), "rule" (-kv-block-size) or "events"
	// (adopted from what the engine's events prove).
	Source          string `json:"block_size_source"`
	EngineBlockSize int    `json:"engine_block_size,omitempty"` // the smallest its stores prove
	// Mismatch: its events prove blocks the pinned size cannot key (a WARN named both).
	Mismatch bool `json:"block_size_mismatch"`
}

type rankInventory struct {
	Rank     int                 `json:"rank"`
	Keys     int                 `json:"keys"`
	InFlight int64               `json:"in_flight"`
	Load     *route.EndpointView `json:"load,omitempty"`
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
		Fleet     fleetView           `json:"fleet"`
		Endpoints []inventoryEndpoint `json:"endpoints"`
	}{Fleet: s.fleet.view(), Endpoints: []inventoryEndpoint{}}
	for i, e := range s.roster().eps {
		if e.vacant {
			continue
		}
		ie := inventoryEndpoint{Slot: i, Draining: e.retired.Load(),
			Name: e.spec.Name, URL: e.spec.URL, Engine: e.spec.Engine.String(), Role: e.spec.Role.String(),
			Parity: "unknown", LastSeq: -1, Breaker: e.breaker.State().String(),
			Healthy: e.healthy.Load(), Down: e.down.Load(), InFlight: s.loads.Get(i),
			Predicted: s.m.predicted[i].Get(), Delivered: s.m.delivered[i].Get(),
			Receipts: s.m.receipts[i].Get(), KVHits: s.m.hits[i].Get(),
		}
		ie.Delivery = deliveryNote(ie.Receipts, ie.Predicted, ie.Delivered)
		state, reasons := s.states.state(i)
		ie.Routing, ie.Reasons, ie.Why = state.String(), reasonList(reasons), "ok"
		if s.kv != nil {
			ie.Keys, ie.Parity, ie.Connected, ie.LastSeq = s.kv.inventory(i)
			ie.Plane = s.kv.planeState(i)
			v := s.queues.View(i, time.Now())
			ie.Load = &v
			if s.cfg.KV.LoadScrape > 0 {
				sc := &scrapeView{OK: e.scrape.ok.Load(), Failed: e.scrape.failed.Load(),
					Failing: e.scrape.failing.Load(), LastMs: float64(e.scrape.duration.Load()) / 1e6}
				if p := e.scrape.lastErr.Load(); p != nil && sc.Failing {
					sc.LastError = *p
				}
				ie.Scrape = sc
			}
			ist := s.kv.mgr.Status(i)
			ie.Why = explainReasons(reasons, &ist, e.spec.Events)
			ie.Ranks = s.kv.rankInventory(i)
			kv := &keyingView{Contract: ist.Contract, BlockSize: ist.BlockSize, Source: "rule",
				EngineBlockSize: ist.EngineBlockSize, Mismatch: ist.BlockSizeMismatch}
			switch {
			case ist.BlockSizeAdopted:
				kv.Source = "events"
			case e.spec.BlockSize > 0:
				kv.Source = "endpoint"
			}
			if kv.BlockSize == 0 { // the event plane's route replicas key by the rule
				kv.BlockSize = s.cfg.KV.BlockSize
			}
			ie.Keying = kv
		}
		if state == StateOff {
			ie.Why = "KV-Exact does not score this endpoint (-kv-mode off, or a mode-1 decode endpoint)"
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
	// Rank is the data-parallel rank the request goes to (X-Data-Parallel-Rank), absent
	// when the endpoint has one rank or its own balancer picks. Scores and Terms name a
	// data-parallel endpoint's ranks "name#rank"; its plain name scores its best rank.
	Rank   *int   `json:"rank,omitempty"`
	Route  string `json:"route"`
	Decode string `json:"decode,omitempty"`
	// Policy is -kv-policy; Terms are each endpoint's inputs to it (cost: queued,
	// uncached, rate, predicted ms), recorded by the decision traffic runs.
	Policy string                 `json:"policy,omitempty"`
	Terms  map[string]route.Terms `json:"terms,omitempty"`
	// Memo is what the decision took from the tokenization and chain memos.
	Memo *explainMemo `json:"memo,omitempty"`
}

type explainMemo struct {
	Tokens   int `json:"tokens"`   // token IDs taken from the tokenization memo
	Segments int `json:"segments"` // text segments between special tokens it answered
	Notes    int `json:"notes"`    // replayed template iterations whose IDs it took whole
	Blocks   int `json:"blocks"`   // block keys taken from the chain memo
	// From the render memo: loop iterations of the chat template and messages bound.
	Iterations int `json:"render_iterations"`
	Replayed   int `json:"render_replayed"` // iterations replayed from the render memo
	Messages   int `json:"render_messages"`
	Bound      int `json:"render_messages_memo"` // messages whose template value came from it
}

// explainTerms is the Observer /debug/explain hands the selector.
type explainTerms struct {
	names []string // candidate -> label (rankLayout.labels)
	terms map[string]route.Terms
}

func (e *explainTerms) Endpoint(sl int, t route.Terms) { e.terms[e.names[sl]] = t }

func (s *Server) serveExplain(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeHTTPError(w, 405, "invalid_request_error", "POST an OpenAI completions or chat body")
		return
	}
	st := s.getState()
	defer s.putState(st)
	body, err := io.ReadAll(io.LimitReader(r.Body, int64(s.cfg.Limits.MaxBodyBytes)+1))
	if err != nil {
		writeHTTPError(w, 400, "invalid_request_error", "reading body: "+err.Error())
		return
	}
	if len(body) > s.cfg.Limits.MaxBodyBytes {
		writeHTTPError(w, 413, "invalid_request_error", "request body exceeds the limit")
		return
	}
	st.bodyBuf = append(st.bodyBuf[:0], body...)
	st.body = st.bodyBuf
	if err := openai.Scan(st.body, &st.oa); err != nil {
		writeHTTPError(w, 400, "invalid_request_error", "malformed request body: "+err.Error())
		return
	}
	st.chat = st.oa.Value[openai.FMessages].Present() || st.oa.Value[openai.FInput].Present() ||
		strings.Contains(r.URL.Query().Get("path"), "chat") || strings.Contains(r.URL.Query().Get("path"), "responses")
	ex := Explanation{Scores: map[string]int{}, Eligible: map[string]bool{}}
	var d decision
	d.ep, d.decode = -1, -1
	labels := s.ranks.labels(s.roster().eps)
	obs := &explainTerms{names: labels, terms: map[string]route.Terms{}}
	st.obs, st.meter = obs, nil // the traffic path, recording instead of counting
	if s.kv != nil {
		ex.Policy, ex.Terms = s.kv.sel.Name(), obs.terms
	}
	if s.cfg.KV.Mode == KVDisaggregated {
		st.sessKey = append(st.sessKey[:0], sessionKey(nil, st)...)
		s.decidePD(st, &d)
	} else {
		s.decide(st, &d, false)
	}
	for i, e := range s.roster().eps {
		if e.retired.Load() {
			continue
		}
		ex.Eligible[e.spec.Name] = st.eligible.Has(i)
	}
	if s.kv != nil {
		eps := s.roster().eps
		for sl, i := range s.ranks.ep[:s.ranks.cands] {
			name := eps[i].spec.Name
			ex.Scores[name] = max(ex.Scores[name], int(st.scores[sl]))
			if s.ranks.dp[i] > 1 {
				ex.Scores[labels[sl]] = int(st.scores[sl])
			}
		}
	}
	if s.kv != nil {
		ex.Tokens, ex.Blocks = len(st.tokens), max(len(st.keys), len(st.fastKeys))
		for _, g := range st.groups[:st.ngroups] {
			ex.Blocks = max(ex.Blocks, len(g.keys)*g.chain.BlockSize()/s.cfg.KV.BlockSize)
		}
	}
	if s.kv != nil && (s.kv.memo != nil || s.kv.chainMemo != nil || s.kv.render != nil) {
		ex.Memo = &explainMemo{Tokens: st.memoUse.Tokens, Segments: st.memoUse.Segments, Notes: st.memoUse.Notes, Blocks: st.memoBlocks,
			Iterations: st.renderUse.Iterations, Replayed: st.renderUse.Replayed,
			Messages: st.renderUse.Messages, Bound: st.renderUse.Bound}
	}
	ex.Route = d.route.String()
	if d.ep >= 0 {
		ex.Endpoint = s.roster().eps[d.ep].spec.Name
	}
	if d.rank >= 0 {
		r := d.rank
		ex.Rank = &r
	}
	if d.decode >= 0 {
		ex.Decode = s.roster().eps[d.decode].spec.Name
	}
	writeJSON(w, 200, ex)
}

func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	ready, why := s.readiness()
	if !ready {
		http.Error(w, why+"\n", http.StatusServiceUnavailable)
		return
	}
	io.WriteString(w, why+"\n") //nolint:errcheck
}

// readiness says whether a balancer should send this replica traffic, and why. It
// turns false first thing on shutdown (the drain delay lets balancers notice before
// the listener stops). In mode 1 it needs an eligible prefill AND decode endpoint:
// with only one side every request would be answered 503. Degraded KV routing is
// still ready (requests are served by the rule's selector); the answer names it.
func (s *Server) readiness() (bool, string) {
	if s.draining.Load() {
		return false, "shutting down"
	}
	if !s.ready.Load() {
		return false, "starting"
	}
	usable := func(e *endpoint) bool {
		return !e.retired.Load() && e.healthy.Load() && !e.down.Load() && (s.cfg.Health.Interval == 0 || e.checked.Load()) && e.breaker.Ready()
	}
	var any, prefill, decode bool
	for _, e := range s.roster().eps {
		if !usable(e) {
			continue
		}
		any = true
		prefill = prefill || e.spec.Role == RolePrefill
		decode = decode || e.spec.Role == RoleDecode
	}
	switch {
	case !any:
		return false, "no healthy endpoint"
	case s.cfg.KV.Mode == KVDisaggregated && !prefill:
		return false, "no eligible prefill endpoint (mode 1 needs a prefill and a decode endpoint)"
	case s.cfg.KV.Mode == KVDisaggregated && !decode:
		return false, "no eligible decode endpoint (mode 1 needs a prefill and a decode endpoint)"
	}
	var degraded []string
	for i, e := range s.roster().eps {
		if e.retired.Load() {
			continue
		}
		if st, reasons := s.states.state(i); st == StateDegraded {
			degraded = append(degraded, e.spec.Name+": "+strings.Join(reasonList(reasons), ","))
		}
	}
	if len(degraded) > 0 {
		return true, "ready (KV routing degraded: " + strings.Join(degraded, "; ") + ")"
	}
	return true, "ready"
}

func (s *Server) serveAdminState(w http.ResponseWriter, r *http.Request) {
	name, op := r.PathValue("name"), r.PathValue("op")
	if op != "down" && op != "up" {
		writeHTTPError(w, 404, "not_found", "want /admin/endpoints/{name}/down or /up")
		return
	}
	for _, e := range s.roster().eps {
		if !e.retired.Load() && e.spec.Name == name {
			e.down.Store(op == "down")
			s.log.Warn("endpoint administrative state changed", "endpoint", name, "down", op == "down")
			writeJSON(w, 200, map[string]any{"endpoint": name, "down": op == "down"})
			return
		}
	}
	writeHTTPError(w, 404, "not_found", "no endpoint named "+name)
}

// maxSpecBytes bounds an admin endpoint spec body.
const maxSpecBytes = 64 << 10

// serveAdminAdd adds the endpoint its body names, one line in the -endpoint syntax (the
// endpoints file's), through the same path as a file reload: a spec that does not parse
// or validate is refused (400; a name the fleet has, 409) and nothing changes.
func (s *Server) serveAdminAdd(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxSpecBytes+1))
	if err != nil {
		writeHTTPError(w, 400, "invalid_request_error", "reading body: "+err.Error())
		return
	}
	if len(b) > maxSpecBytes {
		writeHTTPError(w, 413, "invalid_request_error", "endpoint spec over 64 KiB")
		return
	}
	spec := strings.TrimSpace(string(b))
	if spec == "" || strings.ContainsAny(spec, "\n") {
		writeHTTPError(w, 400, "invalid_request_error", "POST one endpoint spec line: name=..,url=http://host:port,...")
		return
	}
	if err := s.AddEndpoint(spec); err != nil {
		status := 400
		if strings.Contains(err.Error(), "used twice") {
			status = 409
		}
		s.log.Warn("admin: endpoint add refused: keeping the running endpoints", "spec", spec, "err", err)
		writeHTTPError(w, status, "invalid_request_error", "endpoint refused: "+err.Error())
		return
	}
	sp, _ := ParseEndpoint(spec)
	writeJSON(w, 200, map[string]any{"added": sp.Name})
}

// serveAdminRemove removes the endpoint (or discover=dns template) named in the path: it
// drains its in-flight requests, then frees its inventory and slot.
func (s *Server) serveAdminRemove(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := s.RemoveEndpoint(name); err != nil {
		status := 400
		if errors.Is(err, errNoEndpoint) {
			status = 404
		}
		s.log.Warn("admin: endpoint removal refused: keeping the running endpoints", "endpoint", name, "err", err)
		writeHTTPError(w, status, "invalid_request_error", "endpoint removal refused: "+err.Error())
		return
	}
	writeJSON(w, 200, map[string]any{"removed": name, "draining": true})
}
