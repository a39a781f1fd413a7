package route

import (
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/proxy/balance"
)

// Cost is the default KV-Exact policy (-kv-policy cost): each eligible endpoint is
// scored by the request's predicted time to first token there (Queues.Predict: the
// prefill queued ahead plus the request's uncached tokens at the endpoint's rate, after
// any wait for a batch slot) plus the delay its prefill adds to the requests still
// prefilling there, and the minimum wins. Cache overlap is a credit (fewer
// uncached tokens), not the whole decision: a short hot prefix no longer pulls every
// request onto one engine once its queue costs more than the prefill it saves.
// Blocks only a lower tier holds (host memory, storage) are not free: each token there
// costs its tier's weight of a prefill (Candidates.Uncached).
//
// Ties: two predictions closer than one block's prefill at the faster endpoint's rate are
// within the model's resolution (it counts whole blocks), so they tie; ties go to the
// fewer requests in flight, then to a rotating start, never to endpoint order.
type Cost struct {
	Loads  *balance.Loads
	Queues *Queues
	rot    atomic.Uint64
}

func (c *Cost) Name() string { return "cost" }

func (c *Cost) Select(cd *Candidates, obs Observer) int {
	n := len(cd.Matched)
	if n == 0 {
		return -1
	}
	now := time.Now()
	start := int(c.rot.Add(1) % uint64(n))
	best, bestMs, bestLoad, bestRate := -1, 0.0, int64(0), 0.0
	for j := 0; j < n; j++ {
		i := start + j
		if i >= n {
			i -= n
		}
		if !cd.Eligible.Has(i) {
			continue
		}
		uncached := cd.Uncached(i)
		load := c.Loads.Get(i)
		t := c.Queues.Predict(i, uncached, load, now)
		t.Matched = cd.Matched[i]
		if cd.CPU != nil {
			t.CPU, t.Storage = cd.CPU[i], cd.Storage[i]
		}
		t.GPUTokens = int(t.Matched-t.CPU-t.Storage) * cd.BlockSize
		t.CPUTokens, t.StorageTokens = int(t.CPU)*cd.BlockSize, int(t.Storage)*cd.BlockSize
		if obs != nil {
			obs.Endpoint(i, t)
		}
		if best < 0 {
			best, bestMs, bestLoad, bestRate = i, t.Cost, load, t.Rate
			continue
		}
		band := 1000 * float64(cd.BlockSize) / max(t.Rate, bestRate)
		switch {
		case t.Cost < bestMs-band:
		case t.Cost <= bestMs+band && load < bestLoad:
		default:
			continue
		}
		best, bestMs, bestLoad, bestRate = i, t.Cost, load, t.Rate
	}
	return best
}
