package bench

import (
	"testing"
	"time"
)

// Quantiles from Prometheus (cumulative le) buckets: only what was added between the
// scrapes counts, and a rank falls in the first bucket whose cumulative count reaches it.
func TestRouteQuantiles(t *testing.T) {
	before := map[string]float64{"0.0001": 5, "0.00025": 5, "0.001": 5, "+Inf": 5}
	after := map[string]float64{
		"0.0001":  5 + 90,      // 90 new under 100 us
		"0.00025": 5 + 90 + 9,  // 9 more under 250 us
		"0.001":   5 + 90 + 10, // 1 more under 1 ms
		"+Inf":    5 + 100,
		"bad":     7,
	}
	rr, ok := routeQuantiles(before, after)
	if !ok || rr.Count != 100 {
		t.Fatalf("%+v %v", rr, ok)
	}
	if want := 100 * time.Microsecond; rr.P50 != want {
		t.Errorf("p50 %v, want %v", rr.P50, want)
	}
	if want := 250 * time.Microsecond; rr.P99 != want {
		t.Errorf("p99 %v, want %v", rr.P99, want)
	}
	if _, ok := routeQuantiles(after, after); ok {
		t.Error("no new observations must give no row")
	}
}

// The req/s measurement alternates the paths in rounds of about a second, never fewer
// than three, and the rounds add up to the measurement asked for.
func TestThroughputRounds(t *testing.T) {
	for _, c := range []struct {
		d     time.Duration
		n     int
		round time.Duration
	}{
		{300 * time.Millisecond, 3, 100 * time.Millisecond},
		{3 * time.Second, 3, time.Second},
		{3500 * time.Millisecond, 3, 3500 * time.Millisecond / 3},
		{4 * time.Second, 4, time.Second},
		{15 * time.Second, 15, time.Second},
		{15500 * time.Millisecond, 15, 15500 * time.Millisecond / 15},
	} {
		n, round := throughputRounds(c.d)
		if n != c.n || round != c.round {
			t.Errorf("%v: %d rounds of %v, want %d of %v", c.d, n, round, c.n, c.round)
		}
	}
}
