package ingest

import (
	"context"
	"fmt"
	"github.com/VictoriaMetrics/metrics"
	"sync"
	"sync/atomic"

	"github.com/kvgate/kvgate/engine"
	"github.com/kvgate/kvgate/hashcore"
)

// Manager follows every event-publishing endpoint of a rule: one goroutine per endpoint
// and data-parallel rank, each isolated from the others.
type Manager struct {
	cfg Config
	// byIndex is read lock-free on the request path (UsesFastKeys); endpoints come and
	// go at runtime (AddEndpoint, RemoveEndpoint) by storing into their slot.
	byIndex []atomic.Pointer[endpoint]
	// keyGen counts changes to how endpoints' inventories are keyed (KeyGen).
	keyGen atomic.Uint64

	// chains and fasts share one chain object per distinct contract (contract.go).
	chainMu sync.Mutex
	chains  map[hashcore.Spec]hashcore.Chain
	fasts   map[int]hashcore.Chain

	// eventLag is kvgate_ingest_event_lag_seconds: each live batch's publish-to-applied
	// time, from the batch's own ts (eventlag.go).
	eventLag *metrics.PrometheusHistogram

	mu      sync.Mutex // eps, ctx, started
	eps     []*endpoint
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	started bool
}

// NewManager validates the endpoints and prepares their state; nothing runs until Start.
// Config.Slots sets how many inventory indices endpoints may use (AddEndpoint included);
// 0 sizes it to the given endpoints.
func NewManager(cfg Config, eps []EndpointConfig) (*Manager, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, chains: map[hashcore.Spec]hashcore.Chain{}, fasts: map[int]hashcore.Chain{}}
	m.eventLag = newEventLag(cfg.Metrics)
	if cfg.Chain != nil && cfg.Spec != nil {
		m.chains[*cfg.Spec] = cfg.Chain
	}
	m.fasts[cfg.Fast.BlockSize()] = cfg.Fast
	slots := cfg.Slots
	for i := range eps {
		slots = max(slots, eps[i].Index+1)
	}
	m.byIndex = make([]atomic.Pointer[endpoint], slots)
	for i := range eps {
		if err := m.add(eps[i]); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// inventorySlots are every slot ec's keys go to: its index (rank 0), its other ranks'
// and its lower tiers'.
func (ec *EndpointConfig) inventorySlots() []int {
	s := append([]int{ec.Index}, ec.RankSlots...)
	s = append(s, ec.CPUSlots...)
	return append(s, ec.StorageSlots...)
}

// add validates ec and takes its slots (m.mu held, or before the Manager is shared).
func (m *Manager) add(ec EndpointConfig) error {
	if err := ec.validate(); err != nil {
		return err
	}
	if ec.Index >= len(m.byIndex) {
		return fieldError(ec.Name, FieldIndex, "ingest: endpoint %q: inventory index %d beyond the %d slots", ec.Name, ec.Index, len(m.byIndex))
	}
	mine := ec.inventorySlots()
	for j, a := range mine {
		for _, b := range mine[:j] {
			if a == b {
				return fieldError(ec.Name, FieldIndex, "ingest: %q uses inventory slot %d twice", ec.Name, a)
			}
		}
	}
	for _, o := range m.eps {
		if o.cfg.Name == ec.Name {
			return fieldError(ec.Name, FieldName, "ingest: endpoint name %q used twice", ec.Name)
		}
		for _, a := range o.cfg.inventorySlots() {
			for _, b := range mine {
				if a == b {
					return fieldError(ec.Name, FieldIndex, "ingest: %q and %q share inventory slot %d", o.cfg.Name, ec.Name, a)
				}
			}
		}
	}
	e := newEndpoint(m, ec)
	ct, err := m.newContract(&ec)
	if err != nil {
		return fmt.Errorf("ingest: %s: %w", ec.Name, err)
	}
	e.ct.Store(ct)
	held, _ := m.cfg.Inventory.(heldInventory)
	for r, slot := range append([]int{ec.Index}, ec.RankSlots...) {
		rs := &rankState{rank: r, slot: slot,
			blocks: newBlockMap(m.cfg.BlockMapSize), refs: newRefTable(m.cfg.RefCountSize)}
		for md := Medium(0); md < numMedia; md++ {
			rs.tierSlot[md] = -1
			switch {
			case m.cfg.Routed.Has(md):
				rs.tierSlot[md] = slot
			case md == MediumCPU && len(ec.CPUSlots) > 0:
				rs.tierSlot[md] = ec.CPUSlots[r]
			case md != MediumCPU && len(ec.StorageSlots) > 0:
				rs.tierSlot[md] = ec.StorageSlots[r]
			}
		}
		rs.singlesOn = held != nil && !e.fast.Load() && rs.tierSlot[singleTier] == slot && m.cfg.Inventory.Count(slot) == 0
		e.rk = append(e.rk, rs)
	}
	m.eps = append(m.eps, e)
	m.byIndex[ec.Index].Store(e)
	m.keysChanged()
	return nil
}

// KeyGen is a count of the changes to what Contract and UsesFastKeys answer for any
// endpoint (one added or removed, a block size adopted, a switch to fast keys); it moves
// after each change is visible. Why: the request path classifies every endpoint by the
// keys its inventory holds, and at 1,024 endpoints asking each one every request cost
// ~20 us; it keeps the classification and redoes it when the count moves.
func (m *Manager) KeyGen() uint64 { return m.keyGen.Load() }

// keysChanged moves KeyGen and tells Config.OnKeysChange.
func (m *Manager) keysChanged() {
	m.keyGen.Add(1)
	if f := m.cfg.OnKeysChange; f != nil {
		f()
	}
}

// Start launches the subscribers and pollers. It does not block; a second call is a no-op.
func (m *Manager) Start(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.started {
		return
	}
	m.started = true
	m.ctx, m.cancel = context.WithCancel(ctx)
	for _, e := range m.eps {
		m.launch(e)
	}
}

// launch runs e's subscribers (one per rank) or its TensorRT-LLM drain under its own
// context, so RemoveEndpoint stops them alone (m.mu held, m.ctx set).
func (m *Manager) launch(e *endpoint) {
	ctx, cancel := context.WithCancel(m.ctx)
	e.stop = cancel
	run := func(f func(context.Context)) {
		m.wg.Add(1)
		e.wg.Add(1)
		go func() { defer m.wg.Done(); defer e.wg.Done(); f(ctx) }()
	}
	switch e.cfg.Engine {
	case engine.TRTLLM:
		run(newTRTPoller(e).run)
	default:
		for _, r := range e.rk {
			run(newRankSub(e, r).run)
		}
	}
}

// AddEndpoint follows one more endpoint at runtime (its inventory index must be free);
// after Start its subscribers run at once.
func (m *Manager) AddEndpoint(ec EndpointConfig) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.add(ec); err != nil {
		return err
	}
	if m.started {
		m.launch(m.eps[len(m.eps)-1])
	}
	return nil
}

// RemoveEndpoint stops following the endpoint at inventory index i: it leaves the
// Manager and the metrics set at once (its name may be added again right away) and its
// subscribers are told to stop; wait returns once they ended, after which the caller
// clears its keys from the inventory (no subscriber can re-add them then). Unknown i:
// wait returns at once.
func (m *Manager) RemoveEndpoint(i int) (wait func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.endpoint(i)
	if e == nil {
		return func() {}
	}
	m.byIndex[i].Store(nil)
	m.keysChanged()
	for j, o := range m.eps {
		if o == e {
			m.eps = append(m.eps[:j], m.eps[j+1:]...)
			break
		}
	}
	if m.cfg.Metrics != nil {
		for _, name := range e.series {
			m.cfg.Metrics.UnregisterMetric(name)
		}
	}
	if e.stop != nil {
		e.stop()
	}
	return e.wg.Wait
}

// Close stops every subscriber and waits for them.
func (m *Manager) Close() error {
	m.mu.Lock()
	cancel := m.cancel
	m.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	m.wg.Wait()
	return nil
}

func (m *Manager) endpoint(i int) *endpoint {
	if i < 0 || i >= len(m.byIndex) {
		return nil
	}
	return m.byIndex[i].Load()
}

// Redial cuts endpoint i's redial backoff short: a subscriber (or TensorRT-LLM drain)
// waiting to retry its engine retries at once. The proxy calls it when the engine's
// health check passes again, so its events resume within a dial instead of after a
// backoff of up to MaxRetryInterval. A connected subscriber ignores it.
func (m *Manager) Redial(i int) {
	e := m.endpoint(i)
	if e == nil {
		return
	}
	for r := 0; r < e.ranks(); r++ {
		select {
		case e.wake <- struct{}{}:
		default:
		}
	}
}

// Status returns a snapshot of the endpoint at inventory index i (zero value with
// Parity "unknown" for an index no endpoint uses).
func (m *Manager) Status(i int) EndpointStatus {
	e := m.endpoint(i)
	if e == nil {
		return EndpointStatus{Index: i, Parity: parityNames[parityUnknown], LastSeq: -1}
	}
	return e.status()
}

// UsesFastKeys reports whether endpoint i's inventory holds kvgate's fast keys (so the
// request path must compute the fast chain to score it). Lock-free.
func (m *Manager) UsesFastKeys(i int) bool {
	e := m.endpoint(i)
	return e != nil && e.fast.Load()
}
