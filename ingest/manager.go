package ingest

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/kvgate/kvgate/engine"
	"github.com/kvgate/kvgate/hashcore"
)

// Manager follows every event-publishing endpoint of a rule: one goroutine per endpoint
// and data-parallel rank, each isolated from the others.
type Manager struct {
	cfg     Config
	eps     []*endpoint
	byIndex []*endpoint

	// chains and fasts share one chain object per distinct contract (contract.go).
	chainMu sync.Mutex
	chains  map[hashcore.Spec]hashcore.Chain
	fasts   map[int]hashcore.Chain

	mu      sync.Mutex
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	started bool
}

// NewManager validates the endpoints and prepares their state; nothing runs until Start.
func NewManager(cfg Config, eps []EndpointConfig) (*Manager, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, chains: map[hashcore.Spec]hashcore.Chain{}, fasts: map[int]hashcore.Chain{}}
	if cfg.Chain != nil && cfg.Spec != nil {
		m.chains[*cfg.Spec] = cfg.Chain
	}
	m.fasts[cfg.Fast.BlockSize()] = cfg.Fast
	names := map[string]bool{}
	slotOwner := map[int]string{}
	maxIdx := -1
	for i := range eps {
		ec := eps[i]
		if err := ec.validate(); err != nil {
			return nil, err
		}
		if names[ec.Name] {
			return nil, fieldError(ec.Name, FieldName, "ingest: endpoint name %q used twice", ec.Name)
		}
		names[ec.Name] = true
		maxIdx = max(maxIdx, ec.Index)
		e := newEndpoint(m, ec)
		ct, err := m.newContract(&ec)
		if err != nil {
			return nil, fmt.Errorf("ingest: %s: %w", ec.Name, err)
		}
		e.ct.Store(ct)
		slots := append([]int{ec.Index}, ec.RankSlots...)
		for r, slot := range slots {
			if prev, ok := slotOwner[slot]; ok {
				return nil, fieldError(ec.Name, FieldIndex, "ingest: %q and %q share inventory slot %d", prev, ec.Name, slot)
			}
			slotOwner[slot] = ec.Name
			rs := &rankState{rank: r, slot: slot,
				blocks: newBlockMap(cfg.BlockMapSize), refs: newRefTable(cfg.RefCountSize)}
			for m := Medium(0); m < numMedia; m++ {
				rs.tierSlot[m] = -1
				switch {
				case cfg.Routed.Has(m):
					rs.tierSlot[m] = slot
				case m == MediumCPU && len(ec.CPUSlots) > 0:
					rs.tierSlot[m] = ec.CPUSlots[r]
				case m != MediumCPU && len(ec.StorageSlots) > 0:
					rs.tierSlot[m] = ec.StorageSlots[r]
				}
			}
			e.rk = append(e.rk, rs)
		}
		for _, ts := range append(slices.Clone(ec.CPUSlots), ec.StorageSlots...) {
			if prev, ok := slotOwner[ts]; ok {
				return nil, fieldError(ec.Name, FieldIndex, "ingest: %q and %q share inventory slot %d", prev, ec.Name, ts)
			}
			slotOwner[ts] = ec.Name
		}
		m.eps = append(m.eps, e)
	}
	m.byIndex = make([]*endpoint, maxIdx+1)
	for _, e := range m.eps {
		m.byIndex[e.cfg.Index] = e
	}
	return m, nil
}

// Start launches the subscribers and pollers. It does not block; a second call is a no-op.
func (m *Manager) Start(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.started {
		return
	}
	m.started = true
	ctx, m.cancel = context.WithCancel(ctx)
	for _, e := range m.eps {
		switch e.cfg.Engine {
		case engine.TRTLLM:
			p := newTRTPoller(e)
			m.wg.Add(1)
			go func() { defer m.wg.Done(); p.run(ctx) }()
		default:
			for _, r := range e.rk {
				s := newRankSub(e, r)
				m.wg.Add(1)
				go func() { defer m.wg.Done(); s.run(ctx) }()
			}
		}
	}
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
	return m.byIndex[i]
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
