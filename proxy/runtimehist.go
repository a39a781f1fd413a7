package proxy

import (
	"io"
	"math"
	"runtime/metrics"
	"strconv"
)

// The Go runtime's scheduling latency and stop-the-world pauses, as Prometheus
// histograms: what an operator reads when the event lag's tail grows (a goroutine
// runnable but waiting for a core, a GC pause). VictoriaMetrics writes these families
// without _sum and _count (dropped as incomplete, exposition.go); here the runtime's
// fine buckets are folded into fixed ones (each runtime bucket counted under the first
// bound at or above its upper edge, so a count is never placed below its bucket), the
// count is exact and the sum is estimated from each runtime bucket's midpoint (the
// runtime keeps no sum).

// runtimeHistBounds are the exposed upper bounds, seconds: scheduling latency lives in
// microseconds on an idle machine and in milliseconds on a busy one.
var runtimeHistBounds = []float64{1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1}

var runtimeHists = []struct{ family, sample, help string }{
	{"go_sched_latencies_seconds", "/sched/latencies:seconds",
		"Time goroutines spent runnable before they ran (Go runtime /sched/latencies:seconds; _sum estimated from bucket midpoints)."},
	{"go_gc_pauses_seconds", "/sched/pauses/total/gc:seconds",
		"Stop-the-world pauses of the garbage collector (Go runtime /sched/pauses/total/gc:seconds; _sum estimated from bucket midpoints)."},
}

// writeRuntimeHists appends the runtime histograms' families to w.
func writeRuntimeHists(w io.Writer) {
	samples := make([]metrics.Sample, len(runtimeHists))
	for i, h := range runtimeHists {
		samples[i].Name = h.sample
	}
	metrics.Read(samples)
	var b []byte
	for i, h := range runtimeHists {
		if samples[i].Value.Kind() != metrics.KindFloat64Histogram {
			continue // a runtime without this metric
		}
		b = appendRuntimeHist(b, h.family, h.help, samples[i].Value.Float64Histogram())
	}
	w.Write(b) //nolint:errcheck
}

func appendRuntimeHist(b []byte, name, help string, h *metrics.Float64Histogram) []byte {
	cum := make([]uint64, len(runtimeHistBounds)+1) // per exposed bucket, then +Inf
	var count uint64
	var sum float64
	for i, c := range h.Counts {
		if c == 0 {
			continue
		}
		lo, hi := h.Buckets[i], h.Buckets[i+1]
		mid := (lo + hi) / 2
		switch {
		case math.IsInf(lo, -1):
			mid = max(hi, 0)
		case math.IsInf(hi, 1):
			mid = lo
		}
		sum += mid * float64(c)
		count += c
		j := len(runtimeHistBounds)
		for k, ub := range runtimeHistBounds {
			if hi <= ub {
				j = k
				break
			}
		}
		cum[j] += c
	}
	b = append(b, "# HELP "+name+" "+help+"\n# TYPE "+name+" histogram\n"...)
	var run uint64
	for k, ub := range runtimeHistBounds {
		run += cum[k]
		b = append(b, name+`_bucket{le="`...)
		b = strconv.AppendFloat(b, ub, 'g', -1, 64)
		b = append(b, `"} `...)
		b = strconv.AppendUint(b, run, 10)
		b = append(b, '\n')
	}
	b = append(b, name+`_bucket{le="+Inf"} `...)
	b = strconv.AppendUint(b, count, 10)
	b = append(b, '\n')
	b = append(b, name+"_sum "...)
	b = strconv.AppendFloat(b, sum, 'g', -1, 64)
	b = append(b, '\n')
	b = append(b, name+"_count "...)
	b = strconv.AppendUint(b, count, 10)
	return append(b, '\n')
}
