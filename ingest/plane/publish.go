package plane

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvgate/kvgate/ingest"
)

// Inventory is what an ingest replica's plane needs of its inventory: ingest's writes,
// and paging through an endpoint's keys for snapshots (a *shard.Inventory).
type Inventory interface {
	ingest.Inventory
	Keys(ep int, cursor uint64, limit int, dst []uint64) ([]uint64, uint64)
}

// Ingest is the publishing side. It is the inventory an ingest.Manager writes to (pass it
// as ingest.Config.Inventory): every Add, Remove and ClearEndpoint is applied to the
// replica's own inventory and queued, in the same order and under the same per-endpoint
// lock, as a plane message. So the stream is exactly what this replica applied, and a
// snapshot taken under that lock covers exactly the ops queued before it.
//
// The ingest path never waits for the plane: ops are queued without blocking, and an op
// that cannot be queued or published (queue full, plane down, a failed ack) is counted
// and makes its endpoint due for a fresh snapshot, which is the resync route replicas
// follow. Route replicas see the lost op as a seq gap and report the endpoint degraded
// until that snapshot.
type Ingest struct {
	cfg   Config
	inv   Inventory
	eps   []*pubEndpoint // by inventory index; nil = not carried
	all   []*pubEndpoint
	bySub map[string]*pubEndpoint // events/head/cont/req subject -> endpoint (cold paths)
	fast  atomic.Pointer[func(int) bool]
	epoch uint64
	q     chan outItem

	nc        *nats.Conn
	js        jetstream.JetStream
	up        atomic.Bool
	streamOK  atomic.Bool
	wake      chan struct{}
	published *metrics.Counter

	mu     sync.Mutex
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type outItem struct {
	p    *pubEndpoint
	msgs []*nats.Msg
}

// pubEndpoint is one endpoint's publishing state.
type pubEndpoint struct {
	Endpoint
	subj subjects

	mu  sync.Mutex // orders an op's local apply and its queueing; held for a snapshot
	seq uint64     // last op's seq (under mu)

	due      atomic.Bool // a snapshot is wanted before the next interval
	lastSnap time.Time   // snapshotter goroutine only
	buf      []uint64    // snapshotter scratch

	published, dropped, snapshots, failed *metrics.Counter
}

// NewIngest prepares the publishing side for eps; nothing connects until Start.
func NewIngest(cfg Config, inv Inventory, eps []Endpoint) (*Ingest, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if inv == nil {
		return nil, fmt.Errorf("plane: no inventory")
	}
	n, err := checkEndpoints(eps)
	if err != nil {
		return nil, err
	}
	var eb [8]byte
	rand.Read(eb[:])
	g := &Ingest{cfg: cfg, inv: inv, eps: make([]*pubEndpoint, n), bySub: map[string]*pubEndpoint{},
		epoch: binary.LittleEndian.Uint64(eb[:]) | 1, q: make(chan outItem, cfg.Queue), wake: make(chan struct{}, 1)}
	set := cfg.Metrics
	g.published = set.GetOrCreateCounter("kvgate_plane_ingest_published_total")
	for _, e := range eps {
		p := &pubEndpoint{Endpoint: e, subj: subjectsFor(cfg.Prefix, e.Name)}
		nm := labelSafe(e.Name)
		p.published = set.GetOrCreateCounter(metricName("kvgate_plane_ingest_messages_total", nm, `result="published"`))
		p.dropped = set.GetOrCreateCounter(metricName("kvgate_plane_ingest_messages_total", nm, `result="dropped"`))
		p.failed = set.GetOrCreateCounter(metricName("kvgate_plane_ingest_messages_total", nm, `result="failed_ack"`))
		p.snapshots = set.GetOrCreateCounter(metricName("kvgate_plane_ingest_snapshots_total", nm, ""))
		p.due.Store(true) // the epoch's first snapshot resets what route replicas hold
		g.eps[e.Index] = p
		g.all = append(g.all, p)
		for _, s := range []string{p.subj.events, p.subj.head, p.subj.cont, p.subj.req} {
			g.bySub[s] = p
		}
	}
	set.GetOrCreateGauge("kvgate_plane_ingest_connected", func() float64 { return b2f(g.up.Load()) })
	set.GetOrCreateGauge("kvgate_plane_ingest_publishing", func() float64 { return b2f(g.Publishing()) })
	return g, nil
}

// SetKeyKind tells the plane which endpoints' inventories hold kvgate's fast keys (the
// ingest.Manager's UsesFastKeys). Call it before Start; until then every key is the
// engine's.
func (g *Ingest) SetKeyKind(fast func(ep int) bool) { g.fast.Store(&fast) }

func (g *Ingest) kind(ep int) uint8 {
	if f := g.fast.Load(); f != nil && (*f)(ep) {
		return kindFast
	}
	return kindEngine
}

func (g *Ingest) ep(i int) *pubEndpoint {
	if i < 0 || i >= len(g.eps) {
		return nil
	}
	return g.eps[i]
}

// Add applies and publishes a store.
func (g *Ingest) Add(ep int, keys []uint64) int {
	p := g.ep(ep)
	if p == nil {
		return g.inv.Add(ep, keys)
	}
	p.mu.Lock()
	n := g.inv.Add(ep, keys)
	if len(keys) > 0 {
		g.emitLocked(p, OpStore, keys)
	}
	p.mu.Unlock()
	return n
}

// Remove applies and publishes a remove.
func (g *Ingest) Remove(ep int, keys []uint64) int {
	p := g.ep(ep)
	if p == nil {
		return g.inv.Remove(ep, keys)
	}
	p.mu.Lock()
	n := g.inv.Remove(ep, keys)
	if len(keys) > 0 {
		g.emitLocked(p, OpRemove, keys)
	}
	p.mu.Unlock()
	return n
}

// ClearEndpoint applies and publishes a clear.
func (g *Ingest) ClearEndpoint(ep int) {
	p := g.ep(ep)
	if p == nil {
		g.inv.ClearEndpoint(ep)
		return
	}
	p.mu.Lock()
	g.inv.ClearEndpoint(ep)
	g.emitLocked(p, OpClear, nil)
	p.mu.Unlock()
}

// Count is the replica's own count.
func (g *Ingest) Count(ep int) int { return g.inv.Count(ep) }

// emitLocked queues one op (p.mu held), split into ChunkKeys-key messages so none
// exceeds the server's max_payload. The keys are copied: the caller's slice is its
// scratch.
func (g *Ingest) emitLocked(p *pubEndpoint, op Op, keys []uint64) {
	kind := g.kind(p.Index)
	for {
		part := keys[:min(len(keys), g.cfg.ChunkKeys)]
		keys = keys[len(part):]
		p.seq++
		data := appendMsg(make([]byte, 0, headerLen+8*len(part)),
			header{op: op, kind: kind, epoch: g.epoch, seq: p.seq}, part)
		g.enqueue(outItem{p: p, msgs: []*nats.Msg{{Subject: p.subj.events, Data: data}}})
		if len(keys) == 0 {
			return
		}
	}
}

func (g *Ingest) enqueue(it outItem) bool {
	select {
	case g.q <- it:
		return true
	default:
		it.p.dropped.Add(len(it.msgs))
		g.markDue(it.p)
		return false
	}
}

func (g *Ingest) markDue(p *pubEndpoint) {
	p.due.Store(true)
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// Start connects (retrying in the background) and starts the publisher and snapshotter.
func (g *Ingest) Start(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cancel != nil {
		return nil
	}
	log := g.cfg.Logger
	nc, err := connect(&g.cfg, "kvgate-ingest",
		func(err error) {
			if g.up.Swap(false) {
				log.Warn("plane: disconnected from NATS: events are not shared until it returns", "err", err)
			}
		},
		func(nc *nats.Conn) {
			if !g.up.Swap(true) {
				log.Info("plane: connected to NATS", "url", nc.ConnectedUrl())
			}
			g.streamOK.Store(false) // (re)create the stream: the server may have lost it
			for _, p := range g.all {
				g.markDue(p) // ops were dropped while down
			}
		})
	if err != nil {
		return fmt.Errorf("plane: -nats-url %s: %w", g.cfg.URL, err)
	}
	g.nc = nc
	g.js, err = jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(4096),
		jetstream.WithPublishAsyncTimeout(5*time.Second),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
			if p := g.bySub[m.Subject]; p != nil {
				p.failed.Inc()
				g.markDue(p)
			}
		}))
	if err != nil {
		nc.Close()
		return fmt.Errorf("plane: jetstream: %w", err)
	}
	if _, err := nc.Subscribe(g.cfg.Prefix+"_req.*", func(m *nats.Msg) {
		if p := g.bySub[m.Subject]; p != nil {
			g.markDue(p)
		}
	}); err != nil {
		nc.Close()
		return fmt.Errorf("plane: subscribe snapshot requests: %w", err)
	}
	if nc.IsConnected() && !g.up.Swap(true) {
		log.Info("plane: connected to NATS", "url", nc.ConnectedUrl())
	} else if !nc.IsConnected() {
		// A failed first connect calls no disconnect handler: say it here.
		log.Warn("plane: NATS unreachable at start: events are not shared until it is up", "url", g.cfg.URL)
	}
	ctx, g.cancel = context.WithCancel(ctx)
	g.wg.Add(2)
	go func() { defer g.wg.Done(); g.publish(ctx) }()
	go func() { defer g.wg.Done(); g.snapshotter(ctx) }()
	return nil
}

// Close stops publishing and closes the connection (pending acks are abandoned).
func (g *Ingest) Close() error {
	g.mu.Lock()
	cancel := g.cancel
	g.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	g.wg.Wait()
	// A graceful stop publishes what is queued and waits briefly for the acks, so route
	// replicas see the last ops (call it after the ingest.Manager is closed).
	for flushing := true; flushing; {
		select {
		case it := <-g.q:
			g.send(it)
		default:
			flushing = false
		}
	}
	select {
	case <-g.js.PublishAsyncComplete():
	case <-time.After(2 * time.Second):
	}
	g.nc.Close()
	return nil
}

// Connected reports whether the plane's NATS connection is up.
func (g *Ingest) Connected() bool { return g.up.Load() }

// Publishing reports whether ops reach the stream: connected, and the stream exists. A
// connected replica that cannot create the stream (another stream owns its subjects, no
// JetStream) drops every op, and must not look healthy.
func (g *Ingest) Publishing() bool { return g.up.Load() && g.streamOK.Load() }

// publish sends queued messages in queue order. Async publishes on one connection reach
// the stream in order; no-responder retries are off so a retry cannot reorder.
func (g *Ingest) publish(ctx context.Context) {
	for {
		var it outItem
		select {
		case <-ctx.Done():
			return
		case it = <-g.q:
		}
		g.send(it)
	}
}

// send publishes one queued item, or accounts for it as dropped.
func (g *Ingest) send(it outItem) {
	for _, m := range it.msgs {
		if !g.up.Load() || !g.streamOK.Load() {
			it.p.dropped.Inc()
			g.markDue(it.p)
			continue
		}
		if _, err := g.js.PublishMsgAsync(m, jetstream.WithRetryAttempts(0)); err != nil {
			it.p.dropped.Inc()
			g.markDue(it.p)
			continue
		}
		it.p.published.Inc()
		g.published.Inc()
	}
}

// snapshotter snapshots each endpoint every SnapshotInterval, and sooner (after
// MinSnapshotGap) when it is due: the epoch's start, lost ops, a reconnect, a request.
func (g *Ingest) snapshotter(ctx context.Context) {
	tick := time.NewTicker(min(g.cfg.MinSnapshotGap/2, 100*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-g.wake:
		}
		if !g.up.Load() {
			continue
		}
		if !g.streamOK.Load() {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := g.js.CreateOrUpdateStream(sctx, g.cfg.streamConfig())
			cancel()
			if err != nil {
				g.cfg.Logger.Warn("plane: cannot create the event stream", "stream", g.cfg.Stream, "err", err)
				sleepCtx(ctx, time.Second)
				continue
			}
			g.streamOK.Store(true)
		}
		now := time.Now()
		for _, p := range g.all {
			since := now.Sub(p.lastSnap)
			if since >= g.cfg.SnapshotInterval || (p.due.Load() && since >= g.cfg.MinSnapshotGap) {
				g.snapshot(p, now)
			}
		}
	}
}

// snapshot queues endpoint p's whole key set. It holds p.mu while it reads the keys and
// queues the chunks, so the snapshot is exact at its place in the stream: ingest writes
// to this endpoint wait meanwhile (25-45 ms per million keys on a busy 2-core machine,
// BenchmarkSnapshot1M), scoring does not.
func (g *Ingest) snapshot(p *pubEndpoint, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// One pass with no page limit reads each shard's table once: exact while p.mu holds
	// off this endpoint's writers, even if other endpoints' writes rebuild a shard.
	p.buf, _ = g.inv.Keys(p.Index, 0, 1<<40, p.buf[:0])
	keys := p.buf
	ck := g.cfg.ChunkKeys
	chunks := max(1, (len(keys)+ck-1)/ck)
	h := header{op: OpSnapshot, kind: g.kind(p.Index), epoch: g.epoch, seq: p.seq, chunks: uint32(chunks)}
	msgs := make([]*nats.Msg, chunks)
	for c := range msgs {
		part := keys[min(c*ck, len(keys)):min((c+1)*ck, len(keys))]
		h.chunk = uint32(c)
		subj := p.subj.cont
		if c == 0 {
			subj = p.subj.head
		}
		msgs[c] = &nats.Msg{Subject: subj, Data: appendMsg(make([]byte, 0, headerLen+8*len(part)), h, part)}
	}
	if len(p.buf) > 1<<20 {
		p.buf = nil // do not pin a huge scratch between snapshots
	}
	p.lastSnap = now
	p.due.Store(false)
	if g.enqueue(outItem{p: p, msgs: msgs}) {
		p.snapshots.Inc()
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// labelSafe keeps a name usable as a Prometheus label value.
func labelSafe(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '"' || r == '\\' || r == '\n' || r < 0x20 {
			return '_'
		}
		return r
	}, s)
}
