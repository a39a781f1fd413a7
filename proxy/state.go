package proxy

import (
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/ingest"
)

// RoutingState is how an endpoint is routed by KV-Exact right now.
type RoutingState uint8

const (
	// StateOff: the rule does not score this endpoint by KV (-kv-mode off, or a mode-1
	// decode endpoint, which KV-Exact never scores).
	StateOff RoutingState = iota
	// StateExact: events connected, keys attested or not yet contradicted, nothing amiss.
	StateExact
	// StateDegraded: KV-Exact runs but at least one reason says its scores are doubtful.
	StateDegraded
	numStates
)

var stateNames = [numStates]string{"off", "exact", "degraded"}

func (r RoutingState) String() string { return stateNames[r] }

// DegradedReason is one cause of StateDegraded; an endpoint may have several.
type DegradedReason uint8

const (
	ReasonEventsNotConnected DegradedReason = iota // the event subscriber cannot reach events= (wrong port, engine down)
	ReasonParityMismatch                           // engine keys differ from the rule's contract (routing on re-hashed keys in auto mode)
	ReasonBlockSize                                // the engine publishes blocks of another size than -kv-block-size
	ReasonUnkeyableEvents                          // recent BlockStored events kvgate could not key (no token_ids, orphan parents)
	ReasonTokenizerFailed                          // recent requests failed to template or tokenize (rule-wide)
	ReasonStale                                    // prompts with blocks it has not reported keep coming, no events arrive
	ReasonUnreadableEvents                         // recent event messages did not decode (a wire format kvgate does not read)
	numReasons
)

var reasonNames = [numReasons]string{"events_not_connected", "parity_mismatch", "block_size",
	"unkeyable_events", "tokenizer_failed", "stale", "unreadable_events"}

func (r DegradedReason) String() string { return reasonNames[r] }

// stateTuning are the watcher's thresholds; tests shorten them.
type stateTuning struct {
	every         time.Duration // evaluation period
	disconnected  time.Duration // events down this long before it counts (a dial at start takes a moment)
	recent        time.Duration // unkeyable / tokenizer failures within this window count
	staleRequests uint64        // requests with new blocks sent since the endpoint's last event batch
	zeroHitMisses uint64        // consecutive no_worker misses with a populated inventory
	populatedKeys int64         // inventory keys (all endpoints) that make it "populated"
}

var defaultStateTuning = stateTuning{
	every: time.Second, disconnected: 3 * time.Second, recent: 30 * time.Second,
	staleRequests: 200, zeroHitMisses: 200, populatedKeys: 64,
}

// epState is the watcher's view of one endpoint. cur is read lock-free by /metrics and
// /debug/inventory, and the request path counts sentNew; the rest belongs to the watcher
// goroutine.
type epState struct {
	cur atomic.Uint32 // state | reasons<<8
	// sentNew counts the requests sent to the endpoint whose prompt has full blocks it has
	// not reported holding (kvRouter.sendsNewBlocks): each should make it publish stored
	// blocks. Only these count toward stale: a prompt the engine already caches in full
	// (a hot system prompt with a short question in its last, partial block) makes a
	// healthy engine publish nothing, and counting every request flagged such traffic
	// stale (bench/RESULTS.md, session 11).
	sentNew atomic.Uint64

	downSince     time.Time
	lastUnkeyable uint64
	unkeyableAt   time.Time
	lastUnread    uint64 // the endpoint's undecodable event messages, last seen
	unreadAt      time.Time
	lastBatches   uint64
	sentAtBatch   uint64
	initialized   bool
	// owner is the endpoint these fields are about: a slot's new endpoint starts over.
	owner *endpoint
}

func packState(st RoutingState, reasons uint8) uint32 { return uint32(st) | uint32(reasons)<<8 }

func (e *epState) load() (RoutingState, uint8) {
	v := e.cur.Load()
	return RoutingState(v & 0xff), uint8(v >> 8)
}

// stateWatcher turns ingest status, counters and the inventory into each endpoint's
// routing state, warns on every transition and runs the zero-hit watchdog.
type stateWatcher struct {
	s   *Server
	tun stateTuning
	eps []epState

	lastTokFail   uint64
	tokFailAt     time.Time
	hitBase       uint64 // hits counted at the start of the current miss run
	missBase      uint64 // no_worker misses counted then
	zeroHitWarned atomic.Bool
}

func newStateWatcher(s *Server) *stateWatcher {
	w := &stateWatcher{s: s, tun: defaultStateTuning, eps: make([]epState, len(s.roster().eps))}
	for i := range w.eps {
		w.eps[i].cur.Store(packState(w.initialState(i), 0))
	}
	return w
}

// initialState is exact for every KV-scored endpoint until evidence says otherwise.
func (w *stateWatcher) initialState(i int) RoutingState {
	if !w.scored(i) {
		return StateOff
	}
	return StateExact
}

func (w *stateWatcher) scored(i int) bool {
	return w.scoredEP(w.s.roster().eps[i])
}

func (w *stateWatcher) scoredEP(e *endpoint) bool {
	s := w.s
	if s.kv == nil || e.vacant {
		return false
	}
	return !(s.cfg.KV.Mode == KVDisaggregated && e.spec.Role == RoleDecode)
}

// reset gives slot i's state to e, the endpoint taking it (the fleet, before e is
// published); the watcher starts e's evidence over when it next sees the slot.
func (w *stateWatcher) reset(i int, e *endpoint) {
	st := StateOff
	if w.scoredEP(e) {
		st = StateExact
	}
	w.eps[i].cur.Store(packState(st, 0))
}

// evaluate recomputes every endpoint's state once (the watcher goroutine only).
func (w *stateWatcher) evaluate(now time.Time) {
	s := w.s
	if s.kv == nil {
		return
	}
	tokFail := s.m.misses[RouteMissTokenize].Get()
	if tokFail != w.lastTokFail {
		w.lastTokFail, w.tokFailAt = tokFail, now
	}
	tokRecent := !w.tokFailAt.IsZero() && now.Sub(w.tokFailAt) < w.tun.recent
	ros := s.roster()
	for i := range w.eps {
		e := ros.eps[i]
		if e.retired.Load() || !w.scoredEP(e) {
			continue
		}
		if es := &w.eps[i]; es.owner != e {
			es.owner, es.initialized = e, false
			es.downSince, es.unkeyableAt, es.unreadAt = time.Time{}, time.Time{}, time.Time{}
			es.lastUnkeyable, es.lastUnread = 0, 0
		}
		w.evaluateOne(i, now, tokRecent)
	}
	w.watchZeroHits()
}

func (w *stateWatcher) evaluateOne(i int, now time.Time, tokRecent bool) {
	s := w.s
	es := &w.eps[i]
	st := s.kv.mgr.Status(i)
	sent := es.sentNew.Load()
	if !es.initialized {
		es.initialized = true
		es.lastBatches, es.sentAtBatch = st.Batches, sent // unkeyable counts from 0: all since start
	}
	var reasons uint8
	if st.Connected {
		es.downSince = time.Time{}
	} else {
		if es.downSince.IsZero() {
			es.downSince = now
		}
		if now.Sub(es.downSince) >= w.tun.disconnected {
			reasons |= 1 << ReasonEventsNotConnected
		}
	}
	if st.Parity == "mismatch" {
		if strings.HasPrefix(st.Cause, "block size") {
			reasons |= 1 << ReasonBlockSize
		} else {
			reasons |= 1 << ReasonParityMismatch
		}
	}
	if st.Unkeyable != es.lastUnkeyable {
		es.lastUnkeyable, es.unkeyableAt = st.Unkeyable, now
	}
	if !es.unkeyableAt.IsZero() && now.Sub(es.unkeyableAt) < w.tun.recent {
		reasons |= 1 << ReasonUnkeyableEvents
	}
	// An unreadable message still counts as a batch (below), so a publisher kvgate cannot
	// read never looks stale: this is what shows it.
	if st.DecodeErrors != es.lastUnread {
		es.lastUnread, es.unreadAt = st.DecodeErrors, now
	}
	if !es.unreadAt.IsZero() && now.Sub(es.unreadAt) < w.tun.recent {
		reasons |= 1 << ReasonUnreadableEvents
	}
	if tokRecent {
		reasons |= 1 << ReasonTokenizerFailed
	}
	if st.Batches != es.lastBatches {
		es.lastBatches, es.sentAtBatch = st.Batches, sent
	}
	if st.Connected && sent-es.sentAtBatch >= w.tun.staleRequests {
		reasons |= 1 << ReasonStale
	}
	state := StateExact
	if reasons != 0 {
		state = StateDegraded
	}
	oldState, oldReasons := es.load()
	if oldState == state && oldReasons == reasons {
		return
	}
	es.cur.Store(packState(state, reasons))
	s.log.Warn("endpoint routing state changed", "endpoint", s.roster().eps[i].spec.Name,
		"from", stateLabel(oldState, oldReasons), "to", stateLabel(state, reasons),
		"why", explainReasons(reasons, &st, s.roster().eps[i].spec.Events))
}

// watchZeroHits warns once per episode when KV-Exact keeps missing although the
// inventory holds keys: kvgate's keys and the engines' keys never meet, which is a
// contract problem (tokenizer, template, hash settings), not bad luck.
func (w *stateWatcher) watchZeroHits() {
	s := w.s
	var hits uint64
	for i, e := range s.roster().eps {
		if !e.vacant {
			hits += s.m.hits[i].Get()
		}
	}
	misses := s.m.misses[RouteMissNoWorker].Get()
	if hits != w.hitBase {
		w.hitBase, w.missBase = hits, misses
		if w.zeroHitWarned.Swap(false) {
			s.log.Warn("KV-Exact hits again: zero-hit episode over")
		}
		return
	}
	run := misses - w.missBase
	keys := s.kv.inv.Stats().Keys
	if run >= w.tun.zeroHitMisses && keys >= w.tun.populatedKeys && !w.zeroHitWarned.Swap(true) {
		s.log.Warn("KV-Exact: no request matched any cached block although the inventory is populated: a contract problem (tokenizer, chat template, hash algo, seed or block size differ from the engines'); run kvgate doctor",
			"consecutive_misses", run, "inventory_keys", keys)
	}
}

// state returns endpoint i's routing state and reason bits.
func (w *stateWatcher) state(i int) (RoutingState, uint8) { return w.eps[i].load() }

func stateLabel(st RoutingState, reasons uint8) string {
	if st != StateDegraded {
		return st.String()
	}
	return st.String() + "(" + strings.Join(reasonList(reasons), ",") + ")"
}

func reasonList(reasons uint8) []string {
	out := []string{}
	for r := DegradedReason(0); r < numReasons; r++ {
		if reasons&(1<<r) != 0 {
			out = append(out, r.String())
		}
	}
	return out
}

// explainReasons says in words what each reason means for this endpoint.
func explainReasons(reasons uint8, st *ingest.EndpointStatus, events string) string {
	var parts []string
	for r := DegradedReason(0); r < numReasons; r++ {
		if reasons&(1<<r) == 0 {
			continue
		}
		switch r {
		case ReasonEventsNotConnected:
			why := "cannot subscribe to " + events + " (check events= and that the engine publishes KV events); its inventory is not updated"
			if st.LastProtocolError != "" { // a peer that answers but does not speak a ZeroMQ PUB
				why += "; last protocol error: " + st.LastProtocolError
			}
			parts = append(parts, why)
		case ReasonParityMismatch, ReasonBlockSize:
			parts = append(parts, "engine keys differ from the rule's contract: "+st.Cause)
		case ReasonUnkeyableEvents:
			parts = append(parts, "recent BlockStored events could not be keyed (no token_ids or unknown parents)")
		case ReasonTokenizerFailed:
			parts = append(parts, "recent requests failed to template or tokenize (kvgate_kv_misses_total{reason=\"tokenize\"})")
		case ReasonStale:
			parts = append(parts, "prompts with blocks it has not reported keep going to it but no KV events arrive")
		case ReasonUnreadableEvents:
			parts = append(parts, "recent KV event messages did not decode (kvgate_ingest_decode_errors_total; another wire format or engine version?): the events in them are missing from its inventory")
		}
	}
	if len(parts) == 0 {
		return "ok"
	}
	return strings.Join(parts, "; ")
}

// logRule names the rule at start: mode, selector, models and their tokenizers, and the
// hash contract each endpoint is matched under, so a log reader sees what KV-Exact assumes.
func (s *Server) logRule() {
	cfg := &s.cfg
	mode := map[KVMode]string{KVOff: "off", KVConverged: "3 (converged pool)", KVDisaggregated: "1 (prefill/decode)"}[cfg.KV.Mode]
	sel := "rr"
	if cfg.Select.Kind == SelectCHWBL {
		sel = "chwbl"
	}
	models := make([]string, 0, len(cfg.Models.Tokenizers))
	for _, t := range cfg.Models.Tokenizers {
		m := t.Model
		if len(t.Aliases) > 0 {
			m += "(" + strings.Join(t.Aliases, ",") + ")"
		}
		models = append(models, m+"="+t.Dir)
	}
	lora := make([]string, 0, len(cfg.Models.LoRA))
	for a, b := range cfg.Models.LoRA {
		lora = append(lora, a+"->"+b)
	}
	s.log.Info("kvgate rule", "kv_mode", mode, "select", sel, "endpoints", len(s.cfg.Fleet.Endpoints), "slots", len(s.roster().eps),
		"models", strings.Join(models, " "), "lora", strings.Join(lora, " "))
	for i, e := range s.roster().eps {
		if e.vacant {
			continue
		}
		args := []any{"endpoint", e.spec.Name, "url", e.spec.URL, "engine", e.spec.Engine.String(),
			"role", e.spec.Role.String(), "routing", s.states.initialState(i).String()}
		if s.kv != nil && s.states.scored(i) {
			bs := cfg.KV.BlockSize
			if e.spec.BlockSize > 0 {
				bs = e.spec.BlockSize
			}
			args = append(args, "events", e.spec.Events, "contract", s.contractOf(i),
				"block_size", bs, "keys", cfg.KV.Keys)
		}
		s.log.Info("kvgate endpoint", args...)
	}
}

// contractOf names the keys endpoint i's events are matched under.
func (s *Server) contractOf(i int) string {
	e := s.roster().eps[i]
	if e.spec.Engine == EngineTRTLLM || s.kv.chain == nil || s.cfg.KV.Keys == "rehash" {
		return "kvgate/fast (events' token_ids re-hashed)"
	}
	c := s.kv.chain.Name()
	if ec, _ := s.kv.mgr.Contract(i); ec != nil {
		c = ec.Name() // its own (engine, block size), adopted ones included
	}
	if e.spec.Engine == EngineVLLM {
		if s.cfg.KV.HashSeedSet {
			c += " PYTHONHASHSEED=" + s.cfg.KV.HashSeed
		} else {
			c += " PYTHONHASHSEED unset"
		}
	}
	return c
}

// IngestStatus is endpoint i's event-ingest snapshot (ok false when KV-Exact is off);
// `kvgate doctor` reads parity and its diagnosed cause from it.
func (s *Server) IngestStatus(i int) (ingest.EndpointStatus, bool) {
	if s.kv == nil || i < 0 || i >= len(s.roster().eps) {
		return ingest.EndpointStatus{}, false
	}
	return s.kv.mgr.Status(i), true
}

// Contract names the block-key contract endpoint i's events are matched under ("" when
// KV-Exact is off).
func (s *Server) Contract(i int) string {
	if s.kv == nil || i < 0 || i >= len(s.roster().eps) {
		return ""
	}
	return s.contractOf(i)
}
