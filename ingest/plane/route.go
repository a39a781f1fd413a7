package plane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvgate/kvgate/engine"
	"github.com/kvgate/kvgate/ingest"
)

// Endpoint sync states on a route replica.
const (
	StateOK       = "ok"       // following the plane, consistent with the ingest replica
	StateSyncing  = "syncing"  // waiting for a snapshot (start, new ingest epoch, reconnect)
	StateDegraded = "degraded" // routing on what it has: plane down, lost ops, stale
)

var stateNames = [...]string{StateOK, StateSyncing, StateDegraded}

const (
	stOK int32 = iota
	stSyncing
	stDegraded
)

// Why an endpoint is not ok.
const (
	whyNone = iota
	whyStart
	whyNoStream
	whyNoSnapshot
	whyEpoch
	whyDown
	whyReconnect
	whyGap
	whySnapIncomplete
	whyStale
	whyFallback
	whyNoIngest
)

var whyText = [...]string{
	whyNone:           "",
	whyStart:          "starting: reading the newest snapshot",
	whyNoStream:       "no event stream yet: no ingest replica has connected",
	whyNoSnapshot:     "no snapshot in the stream: asked the ingest replica for one",
	whyEpoch:          "a new ingest epoch (ingest replica restarted): waiting for its snapshot",
	whyDown:           "plane down: routing on the inventory as it was",
	whyReconnect:      "plane reconnected: waiting for a fresh snapshot",
	whyGap:            "ops lost (seq gap): waiting for a fresh snapshot",
	whySnapIncomplete: "snapshot chunks missing: waiting for a fresh snapshot",
	whyStale:          "stale: no snapshot or event from the ingest replica for 3 snapshot intervals",
	whyFallback:       "plane down: following the engine directly until it returns",
	whyNoIngest:       "no snapshot from any ingest replica for 3 snapshot intervals: is one publishing this endpoint?",
}

// Route is the consuming side: it keeps each endpoint's inventory slot in step with the
// plane, one ordered consumer per endpoint, starting at the endpoint's newest snapshot.
// It follows no engine (but see Fallback). Consumed ops are applied without allocating
// (a reused key buffer, TestRouteApplyAllocs); the NATS client allocates each message it
// delivers. Snapshots are reconciled, never applied as clear-and-refill.
type Route struct {
	cfg Config
	inv Inventory
	eps []*subEndpoint // by inventory index
	all []*subEndpoint

	nc   *nats.Conn
	conn atomic.Pointer[nats.Conn] // nc, for callbacks that may run before Start assigns nc
	js   jetstream.JetStream
	up   atomic.Bool

	fb        *Fallback
	fbActive  atomic.Pointer[Source]
	keyGen    atomic.Uint64 // KeyGen
	downSince time.Time     // watch goroutine only
	fbFailed  bool          // watch goroutine only

	mu     sync.Mutex
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// subEndpoint is one endpoint's consuming state.
type subEndpoint struct {
	Endpoint
	subj subjects
	r    *Route

	fast      atomic.Bool
	state     atomic.Int32
	why       atomic.Int32
	lastSeq   atomic.Int64 // the ingest seq last applied; -1 none
	streamSeq atomic.Uint64
	lastMsg   atomic.Int64 // unix nanos of the last message consumed
	lastReq   atomic.Int64 // unix nanos of the last snapshot request
	since     atomic.Int64 // unix nanos of the last state change (or Start)
	smu       sync.Mutex   // serializes state transitions (one log line each)

	// The consumer goroutine's own state.
	epoch      uint64 // 0 = no snapshot applied yet
	oldEpoch   uint64 // the epoch before it (an ingest restart), to tell two live publishers
	dualWarned bool
	seq        uint64
	snapEpoch  uint64 // the snapshot being collected
	snapSeq    uint64
	snapNext   uint32 // next chunk expected; == snapChunks when none is in progress
	snapChunks uint32
	snap       []uint64 // its keys so far
	held       []uint64 // reconcile's scratch
	hdr        header
	keys       []uint64

	applied, gaps, snapshots, ignored, decodeErrors, requests, reconciled, dual *metrics.Counter
}

// NewRoute prepares the consuming side for eps over inv; nothing connects until Start.
func NewRoute(cfg Config, inv Inventory, eps []Endpoint) (*Route, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if inv == nil {
		return nil, errors.New("plane: no inventory")
	}
	n, err := checkEndpoints(eps)
	if err != nil {
		return nil, err
	}
	r := &Route{cfg: cfg, inv: inv, eps: make([]*subEndpoint, n)}
	set := cfg.Metrics
	for _, ep := range eps {
		e := &subEndpoint{Endpoint: ep, subj: subjectsFor(cfg.Prefix, ep.Name), r: r}
		e.lastSeq.Store(-1)
		e.state.Store(stSyncing)
		e.why.Store(whyStart)
		// TensorRT-LLM keys are always kvgate's own; a vLLM/SGLang endpoint learns its
		// kind from every message.
		e.fast.Store(ep.Engine == engine.TRTLLM)
		nm := labelSafe(ep.Name)
		ctr := func(base, extra string) *metrics.Counter {
			return set.GetOrCreateCounter(metricName(base, nm, extra))
		}
		e.applied = ctr("kvgate_plane_route_messages_total", `result="applied"`)
		e.ignored = ctr("kvgate_plane_route_messages_total", `result="ignored"`)
		e.decodeErrors = ctr("kvgate_plane_route_messages_total", `result="bad"`)
		e.gaps = ctr("kvgate_plane_route_gaps_total", "")
		e.snapshots = ctr("kvgate_plane_route_snapshots_total", "")
		e.requests = ctr("kvgate_plane_route_snapshot_requests_total", "")
		e.reconciled = ctr("kvgate_plane_route_reconciles_total", "")
		e.dual = ctr("kvgate_plane_route_dual_ingest_total", "")
		set.GetOrCreateGauge(metricName("kvgate_plane_route_state", nm, ""), func() float64 {
			return float64(e.state.Load()) // 0 ok, 1 syncing, 2 degraded
		})
		r.eps[ep.Index] = e
		r.all = append(r.all, e)
	}
	set.GetOrCreateGauge("kvgate_plane_route_connected", func() float64 { return b2f(r.up.Load()) })
	return r, nil
}

func (e *subEndpoint) setState(st int32, why int32) {
	e.smu.Lock()
	defer e.smu.Unlock()
	old, oldWhy := e.state.Load(), e.why.Load()
	if old == st && oldWhy == why {
		return
	}
	if old != st {
		e.since.Store(time.Now().UnixNano())
	}
	e.state.Store(st)
	e.why.Store(why)
	log := e.r.cfg.Logger
	switch {
	case st == stOK:
		log.Info("plane: endpoint in sync", "endpoint", e.Name, "was", stateNames[old], "keys", e.r.inv.Count(e.Index))
	case old == stOK || st == stDegraded:
		log.Warn("plane: endpoint "+stateNames[st], "endpoint", e.Name, "reason", whyText[why])
	default:
		log.Info("plane: endpoint "+stateNames[st], "endpoint", e.Name, "reason", whyText[why])
	}
}

// syncing marks e waiting for a snapshot, unless it has waited too long already: then it
// stays degraded, its WARN standing, until a snapshot comes (no flapping back to syncing
// each time the consumer restarts).
func (e *subEndpoint) syncing(why int32) {
	if e.state.Load() == stDegraded && e.why.Load() == whyNoIngest {
		return
	}
	e.setState(stSyncing, why)
}

// requestSnapshot asks the ingest replicas for a fresh snapshot, at most once per
// MinSnapshotGap per endpoint.
func (e *subEndpoint) requestSnapshot() {
	r := e.r
	now := time.Now().UnixNano()
	last := e.lastReq.Load()
	if now-last < int64(r.cfg.MinSnapshotGap) || !e.lastReq.CompareAndSwap(last, now) {
		return
	}
	if nc := r.conn.Load(); nc != nil && nc.Publish(e.subj.req, nil) == nil {
		e.requests.Inc()
	}
}

// Start connects (retrying in the background) and starts one consumer per endpoint.
func (r *Route) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel != nil {
		return nil
	}
	log := r.cfg.Logger
	nc, err := connect(&r.cfg, "kvgate-route",
		func(err error) {
			if r.up.Swap(false) {
				log.Warn("plane: disconnected from NATS: routing on the inventory as it was", "err", err)
			}
			fb := r.fallbackSource() != nil
			for _, e := range r.all {
				if !fb || !r.covered(e.Index) {
					e.setState(stDegraded, whyDown)
				}
			}
		},
		func(nc *nats.Conn) {
			r.conn.Store(nc)
			if r.up.Swap(true) {
				return
			}
			log.Info("plane: connected to NATS")
			for _, e := range r.all {
				if e.state.Load() != stSyncing || e.why.Load() == whyDown {
					e.setState(stSyncing, whyReconnect)
				}
				e.lastReq.Store(0)
				e.requestSnapshot()
			}
		})
	if err != nil {
		return fmt.Errorf("plane: -nats-url %s: %w", r.cfg.URL, err)
	}
	r.nc = nc
	r.conn.Store(nc)
	if nc.IsConnected() {
		r.up.Store(true)
	} else if !r.up.Load() {
		// A failed first connect calls no disconnect handler: the endpoints are down from
		// the start, and the connect handler resyncs them as after any outage.
		log.Warn("plane: NATS unreachable at start: routing on an empty inventory until it is up", "url", r.cfg.URL)
		for _, e := range r.all {
			e.setState(stDegraded, whyDown)
		}
	}
	r.js, err = jetstream.New(nc)
	if err != nil {
		nc.Close()
		return fmt.Errorf("plane: jetstream: %w", err)
	}
	ctx, r.cancel = context.WithCancel(ctx)
	for _, e := range r.all {
		e.since.Store(time.Now().UnixNano())
		r.wg.Add(1)
		go func() { defer r.wg.Done(); r.follow(ctx, e) }()
	}
	r.wg.Add(1)
	go func() { defer r.wg.Done(); r.watch(ctx) }()
	return nil
}

// Close stops the consumers and closes the connection.
func (r *Route) Close() error {
	r.mu.Lock()
	cancel := r.cancel
	r.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	r.wg.Wait()
	r.nc.Close()
	return nil
}

// watch marks endpoints stale whose ingest replica went quiet: an ingest replica
// snapshots every interval, so three intervals of silence mean none is publishing.
// It also runs the direct fallback, when one is armed.
func (r *Route) watch(ctx context.Context) {
	tick := time.NewTicker(min(r.cfg.SnapshotInterval/2, 100*time.Millisecond))
	defer tick.Stop()
	defer r.stopFallback()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		r.stepFallback(ctx, time.Now())
		now := time.Now().UnixNano()
		for _, e := range r.all {
			if e.state.Load() == stOK && now-e.lastMsg.Load() > 3*int64(r.cfg.SnapshotInterval) {
				e.setState(stDegraded, whyStale)
				e.requestSnapshot()
			}
			// Waiting for a snapshot that never comes (no ingest replica publishes this
			// endpoint) is routing blind: degraded, with a WARN, not syncing forever.
			if e.state.Load() == stSyncing && r.up.Load() && now-e.since.Load() > 3*int64(r.cfg.SnapshotInterval) {
				e.setState(stDegraded, whyNoIngest)
				e.requestSnapshot()
			}
		}
	}
}

// follow consumes one endpoint's subjects from its newest snapshot on. The ordered
// consumer recreates itself after a reconnect from the last stream seq it delivered, so
// an outage resumes where it stopped; the ingest replica's fresh snapshot after its own
// reconnect (or our request) brings the endpoint back to ok.
func (r *Route) follow(ctx context.Context, e *subEndpoint) {
	for ctx.Err() == nil {
		if !r.up.Load() {
			sleepCtx(ctx, r.cfg.ReconnectWait)
			continue
		}
		ocfg, ok := r.startAt(ctx, e)
		if !ok {
			sleepCtx(ctx, r.cfg.ReconnectWait)
			continue
		}
		cons, err := r.js.OrderedConsumer(ctx, r.cfg.Stream, ocfg)
		if err != nil {
			sleepCtx(ctx, r.cfg.ReconnectWait)
			continue
		}
		it, err := cons.Messages(jetstream.PullExpiry(5 * time.Second))
		if err != nil {
			sleepCtx(ctx, r.cfg.ReconnectWait)
			continue
		}
		stop := context.AfterFunc(ctx, it.Stop)
		for {
			m, err := it.Next()
			if err != nil {
				break
			}
			if md, err := m.Metadata(); err == nil {
				e.streamSeq.Store(md.Sequence.Stream)
			}
			e.apply(m.Data())
		}
		stop()
		it.Stop()
	}
}

// startAt finds where endpoint e's consumer begins: its newest snapshot head, or (no
// snapshot retained) new messages, with a request for a snapshot.
func (r *Route) startAt(ctx context.Context, e *subEndpoint) (jetstream.OrderedConsumerConfig, bool) {
	ocfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{e.subj.filter}, InactiveThreshold: time.Minute}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := r.js.Stream(cctx, r.cfg.Stream)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			e.syncing(whyNoStream)
		}
		return ocfg, false
	}
	head, err := st.GetLastMsgForSubject(cctx, e.subj.head)
	switch {
	case err == nil:
		ocfg.DeliverPolicy, ocfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, head.Sequence
	case errors.Is(err, jetstream.ErrMsgNotFound):
		ocfg.DeliverPolicy = jetstream.DeliverNewPolicy
		e.syncing(whyNoSnapshot)
		e.requestSnapshot()
	default:
		return ocfg, false
	}
	return ocfg, true
}

// apply applies one consumed message to the endpoint's inventory slot.
func (e *subEndpoint) apply(data []byte) {
	r := e.r
	h := &e.hdr
	if err := parseHeader(data, h); err != nil {
		e.decodeErrors.Inc()
		return
	}
	e.lastMsg.Store(time.Now().UnixNano())
	if fast := h.kind == kindFast; e.fast.Swap(fast) != fast {
		r.KeysChanged()
	}
	if h.op == OpSnapshot {
		e.applySnapshot(data)
		return
	}
	if e.epoch == 0 || h.epoch != e.epoch {
		// Ops of an epoch whose snapshot this replica has not read: their base is unknown.
		e.ignored.Inc()
		if h.epoch == e.oldEpoch {
			e.dualIngest()
		}
		e.setState(stSyncing, whyEpoch)
		e.requestSnapshot()
		return
	}
	if h.seq <= e.seq {
		e.ignored.Inc() // a duplicate
		return
	}
	if h.seq != e.seq+1 || e.snapNext != e.snapChunks {
		e.gaps.Inc()
		e.snapNext = e.snapChunks
		e.setState(stDegraded, whyGap)
		e.requestSnapshot()
	} else if e.state.Load() != stOK && e.why.Load() == whyStale && r.up.Load() {
		e.setState(stOK, whyNone) // the ingest replica is back on the same epoch, no op lost
	}
	e.seq = h.seq
	e.keys = appendKeys(e.keys[:0], data)
	switch h.op {
	case OpStore:
		r.inv.Add(e.Index, e.keys)
	case OpRemove:
		r.inv.Remove(e.Index, e.keys)
	case OpClear:
		r.inv.ClearEndpoint(e.Index)
	}
	e.lastSeq.Store(int64(h.seq))
	e.applied.Inc()
}

// applySnapshot collects one snapshot chunk; the last one reconciles the endpoint with
// the whole snapshot and puts it in sync. A snapshot that finds the endpoint already at
// its epoch and seq with as many keys changes nothing: that is the periodic case, and
// reconciling it would be wasted work.
func (e *subEndpoint) applySnapshot(data []byte) {
	r := e.r
	h := &e.hdr
	if h.chunk == 0 {
		e.snapEpoch, e.snapSeq, e.snapChunks, e.snapNext = h.epoch, h.seq, h.chunks, 0
		e.snap = e.snap[:0]
	} else if h.epoch != e.snapEpoch || h.seq != e.snapSeq || h.chunk != e.snapNext || h.chunks != e.snapChunks {
		// A continuation without its head (the consumer started mid-snapshot, or chunks
		// were lost): the next head fixes it.
		e.ignored.Inc()
		e.snapNext = e.snapChunks
		if e.epoch != 0 {
			e.setState(stDegraded, whySnapIncomplete)
			e.requestSnapshot()
		}
		return
	}
	e.snap = appendKeys(e.snap, data)
	e.snapNext++
	e.applied.Inc()
	if e.snapNext < e.snapChunks {
		return
	}
	inSync := e.epoch == e.snapEpoch && e.seq == e.snapSeq && e.state.Load() == stOK
	if !inSync || r.inv.Count(e.Index) != len(e.snap) {
		e.reconcile()
	}
	if e.epoch != e.snapEpoch {
		if e.snapEpoch == e.oldEpoch {
			e.dualIngest()
		}
		e.oldEpoch = e.epoch
	}
	e.epoch, e.seq = e.snapEpoch, e.snapSeq
	e.lastSeq.Store(int64(e.seq))
	e.snapshots.Inc()
	if cap(e.snap) > 1<<20 {
		e.snap = nil // do not pin a huge buffer between snapshots
	}
	if r.up.Load() && (r.fallbackSource() == nil || !r.covered(e.Index)) {
		e.setState(stOK, whyNone)
	}
}

// dualIngest records an epoch coming back after a newer one took over: two ingest
// replicas publish this endpoint (say -plane-role both on every replica), and route
// replicas flip between their views. Logged once per endpoint, counted each time.
func (e *subEndpoint) dualIngest() {
	e.dual.Inc()
	if !e.dualWarned {
		e.dualWarned = true
		e.r.cfg.Logger.Warn("plane: two ingest replicas publish this endpoint: run exactly one with -plane-role ingest (or both) per engine; the others -plane-role route",
			"endpoint", e.Name)
	}
}

// reconcile makes the endpoint hold exactly e.snap: the snapshot's keys are added, then
// the keys it lacks removed, so scoring never sees the endpoint emptied and refilled.
func (e *subEndpoint) reconcile() {
	inv := e.r.inv
	inv.Add(e.Index, e.snap)
	slices.Sort(e.snap)
	// One pass with no page limit reads each shard's table once: exact, as this
	// goroutine is the endpoint's only writer.
	e.held, _ = inv.Keys(e.Index, 0, 1<<40, e.held[:0])
	stale := e.held[:0]
	for _, k := range e.held {
		if _, found := slices.BinarySearch(e.snap, k); !found {
			stale = append(stale, k)
		}
	}
	inv.Remove(e.Index, stale)
	e.reconciled.Inc()
	if cap(e.held) > 1<<20 {
		e.held = nil
	}
}

func (r *Route) ep(i int) *subEndpoint {
	if i < 0 || i >= len(r.eps) {
		return nil
	}
	return r.eps[i]
}

// KeyGen is a count of the changes to what UsesFastKeys answers for any endpoint (the
// ingest replica's key kind for one, the direct fallback started or stopped, or a change
// the fallback's own manager reports through KeysChanged): ingest.Manager.KeyGen's
// counterpart on a route replica.
func (r *Route) KeyGen() uint64 { return r.keyGen.Load() }

// KeysChanged moves KeyGen (the fallback's ingest.Config.OnKeysChange).
func (r *Route) KeysChanged() { r.keyGen.Add(1) }

// UsesFastKeys reports whether endpoint i's inventory holds kvgate's fast keys, as the
// ingest replica's last message said (the direct fallback's, while it runs). Lock-free.
func (r *Route) UsesFastKeys(i int) bool {
	if src := r.fallbackSource(); src != nil && r.covered(i) {
		return src.UsesFastKeys(i)
	}
	e := r.ep(i)
	return e != nil && e.fast.Load()
}

// State is endpoint i's sync state and, when not ok, why.
func (r *Route) State(i int) (state, reason string) {
	e := r.ep(i)
	if e == nil {
		return StateDegraded, "not carried by the plane"
	}
	return stateNames[e.state.Load()], whyText[e.why.Load()]
}

// Connected reports whether the plane's NATS connection is up.
func (r *Route) Connected() bool { return r.up.Load() }

// Status is endpoint i in ingest's status shape, for the proxy's admin views: Connected
// means in sync with the plane; LastSeq is the plane's per-endpoint op seq. Parity is
// attested by the ingest replica, not here ("unknown").
func (r *Route) Status(i int) ingest.EndpointStatus {
	e := r.ep(i)
	if e == nil {
		return ingest.EndpointStatus{Index: i, Parity: "unknown", LastSeq: -1}
	}
	if src := r.fallbackSource(); src != nil && r.covered(i) {
		return src.Status(i) // the direct fallback's own subscribers
	}
	ok := e.state.Load() == stOK
	st := ingest.EndpointStatus{Name: e.Name, Engine: e.Engine, Index: i, Connected: ok, Ranks: 1,
		LastSeq: e.lastSeq.Load(), Parity: "unknown", Keys: r.inv.Count(i), Rehash: e.fast.Load()}
	if ok {
		st.RanksUp = 1
	}
	return st
}
