package ingest

import (
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// The event lag is how long a live batch took from the engine's publish to kvgate's
// apply: the engines stamp every batch with their wall clock when they publish it (vLLM
// and SGLang: KVEventBatch ts = time.time(); docs/CONTRACTS.md, "Event lag"), and kvgate
// reads its own when the batch's last event is applied. Across hosts the figure carries
// the two clocks' offset, so it is exact on one host and as good as NTP elsewhere; a batch
// stamped ahead of kvgate's clock counts as 0. Replayed batches are not observed: their
// stamp is as old as the gap they fill.

// eventLagBuckets resolve the sub-5 ms range, where a healthy event path lives, finely
// and the rest by decades, up to a stream seconds behind.
var eventLagBuckets = []float64{0.00025, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005,
	0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

func newEventLag(set *metrics.Set) *metrics.PrometheusHistogram {
	if set == nil {
		set = metrics.NewSet() // private: nothing exposes it
	}
	return set.GetOrCreatePrometheusHistogramExt("kvgate_ingest_event_lag_seconds", eventLagBuckets)
}

// observeLag records a live batch applied now whose engine stamped it ts (Unix seconds);
// ts 0 is a batch without a stamp (not observed).
func (m *Manager) observeLag(ts float64) {
	if ts <= 0 {
		return
	}
	lag := float64(time.Now().UnixNano())/1e9 - ts
	m.eventLag.Update(max(lag, 0))
}
