package ingest

import (
	"github.com/kvgate/kvgate/hashcore"
)

// contract is the keys one endpoint's events are attested and re-hashed under: the
// engine's chain at the endpoint's block size, and kvgate's fast chain at the same size.
// Adopting the block size an engine's events prove replaces it whole (an atomic pointer:
// the request path reads it without a lock).
type contract struct {
	chain hashcore.Chain // nil: no engine contract to attest against
	spec  *hashcore.Spec // what chain was built from; nil: no diagnosis by alternatives
	fast  hashcore.Chain
	// adopted: the block size came from the engine's events, not the rule or the endpoint.
	adopted bool
}

func (c *contract) blockSize() int {
	if c.chain != nil {
		return c.chain.BlockSize()
	}
	return c.fast.BlockSize()
}

// chainFor returns the chain for s, one shared object per distinct spec, so endpoints of
// one contract share it (the request path computes one key chain per chain object).
func (m *Manager) chainFor(s hashcore.Spec) (hashcore.Chain, error) {
	m.chainMu.Lock()
	defer m.chainMu.Unlock()
	if c, ok := m.chains[s]; ok {
		return c, nil
	}
	c, err := hashcore.New(s)
	if err != nil {
		return nil, err
	}
	m.chains[s] = c
	return c, nil
}

// fastFor returns kvgate's fast chain of block size bs, shared likewise.
func (m *Manager) fastFor(bs int) hashcore.Chain {
	m.chainMu.Lock()
	defer m.chainMu.Unlock()
	if c, ok := m.fasts[bs]; ok {
		return c
	}
	c := hashcore.NewFast(bs)
	m.fasts[bs] = c
	return c
}

// newContract is endpoint cfg's contract: its own Spec when set, else the rule's.
func (m *Manager) newContract(cfg *EndpointConfig) (*contract, error) {
	if cfg.Spec == nil {
		return &contract{chain: m.cfg.Chain, spec: m.cfg.Spec, fast: m.cfg.Fast}, nil
	}
	s := *cfg.Spec
	c, err := m.chainFor(s)
	if err != nil {
		return nil, err
	}
	return &contract{chain: c, spec: &s, fast: m.fastFor(s.BlockSize)}, nil
}

// adoptLocked switches e to block size bs, proven by its engine's events, unless the
// endpoint's block size is pinned (EndpointConfig.FixedBlockSize) or bs is what it has.
// Keys already indexed in the fast chain (re-hashed endpoints) were computed at the old
// size: every rank is cleared and fills again from the events. It reports whether the
// contract changed (e.mu held).
func (e *endpoint) adoptLocked(bs int) bool {
	cur := e.ct.Load()
	if e.cfg.FixedBlockSize || bs <= 0 || bs == cur.blockSize() {
		return false
	}
	next := &contract{fast: e.m.fastFor(bs), adopted: true}
	if cur.spec != nil {
		s := *cur.spec
		s.BlockSize = bs
		c, err := e.m.chainFor(s)
		if err != nil {
			return false
		}
		next.chain, next.spec = c, &s
	}
	e.ct.Store(next)
	e.m.keysChanged()
	e.parity.Store(parityUnknown)
	e.cause.Store(nil)
	e.sizeMismatch.Store(false)
	if e.fast.Load() {
		for _, r := range e.rk {
			e.clearLocked(r)
		}
	}
	e.m.cfg.Logger.Warn("ingest: adopted the engine's block size: its events prove blocks of a size the rule does not hash",
		"endpoint", e.cfg.Name, "engine", e.cfg.Engine, "engine_block_size", bs, "rule_block_size", cur.blockSize(),
		"pin", "set block_size= on the endpoint to keep the rule's")
	return true
}

// Contract returns the chains endpoint i's keys are under: the engine's (nil when the
// endpoint has none, or its inventory holds fast keys) and kvgate's fast chain at the
// endpoint's block size. Lock-free; nil, nil for an index no endpoint uses.
func (m *Manager) Contract(i int) (engine, fast hashcore.Chain) {
	e := m.endpoint(i)
	if e == nil {
		return nil, nil
	}
	c := e.ct.Load()
	return c.chain, c.fast
}
