package route

import (
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/proxy/balance"
	"github.com/kvgate/kvgate/shard"
)

// KVFull is the engine-reported KV usage at which a decode endpoint counts as full: a
// new decode there waits for blocks or preempts a running one, so it is passed over while
// another endpoint has room.
const KVFull = 0.95

// Decode picks the decode endpoint of a prefill/decode request: not full, then the fewest
// requests there as the engine reports them (corrected by what kvgate sent or finished
// since; kvgate's in-flight count once the report is stale), then the lower KV usage,
// then a rotating start.
type Decode struct {
	Loads  *balance.Loads
	Queues *Queues
	rot    atomic.Uint64
}

// Select returns the decode endpoint among el, or -1 when el is empty.
func (d *Decode) Select(el shard.Mask) int {
	n := d.Loads.Len()
	if n == 0 {
		return -1
	}
	now := time.Now()
	start := rotatedStart(el, n, el.Count(), d.rot.Add(1))
	best, bestFull, bestRun, bestKV := -1, false, int64(0), 0.0
	for j := 0; j < n; j++ {
		i := start + j
		if i >= n {
			i -= n
		}
		if !el.Has(i) {
			continue
		}
		run, _ := d.Queues.Running(i, d.Loads.Get(i), now)
		kv, fresh := d.Queues.KVUsage(i, now)
		if !fresh || kv < 0 {
			kv = 0
		}
		full := kv >= KVFull
		better := best < 0 ||
			(!full && bestFull) ||
			(full == bestFull && (run < bestRun || (run == bestRun && kv < bestKV)))
		if better {
			best, bestFull, bestRun, bestKV = i, full, run, kv
		}
	}
	return best
}
