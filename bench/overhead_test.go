package bench

import (
	"testing"
	"time"
)

// Quantiles from VictoriaMetrics buckets: only what was added between the scrapes
// counts, and a rank falls in the bucket whose cumulative count first reaches it.
func TestRouteQuantiles(t *testing.T) {
	before := map[string]float64{"1.000e-04...1.136e-04": 5}
	after := map[string]float64{
		"1.000e-04...1.136e-04": 5 + 90, // 90 new under 113.6 us
		"2.154e-04...2.448e-04": 9,      // 9 new under 244.8 us
		"1.000e-03...1.136e-03": 1,      // 1 new under 1.136 ms
		"bad":                   7,
	}
	rr, ok := routeQuantiles(before, after)
	if !ok || rr.Count != 100 {
		t.Fatalf("%+v %v", rr, ok)
	}
	if want := 113600 * time.Nanosecond; rr.P50 != want {
		t.Errorf("p50 %v, want %v", rr.P50, want)
	}
	if want := 244800 * time.Nanosecond; rr.P99 != want {
		t.Errorf("p99 %v, want %v", rr.P99, want)
	}
	if _, ok := routeQuantiles(after, after); ok {
		t.Error("no new observations must give no row")
	}
}
