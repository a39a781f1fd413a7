package balance

import (
	"fmt"
	"math"
	"testing"

	"github.com/kvgate/kvgate/shard"
)

func all(n int) shard.Mask {
	m := shard.NewMask(n)
	m.SetAll(n)
	return m
}

func TestRRSkipsIneligible(t *testing.T) {
	r := NewRR(4)
	m := all(4)
	m.Clear(1)
	seen := map[int]int{}
	for i := 0; i < 300; i++ {
		seen[r.Pick(m)]++
	}
	if seen[1] != 0 || seen[0] != 100 || seen[2] != 100 || seen[3] != 100 {
		t.Errorf("rr spread %v", seen)
	}
	if got := r.Pick(shard.NewMask(4)); got != -1 {
		t.Errorf("empty mask picked %d", got)
	}
}

func TestMinLoadTiesRoundRobin(t *testing.T) {
	r := NewRR(3)
	l := NewLoads(3)
	l.Inc(0)
	seen := map[int]int{}
	for i := 0; i < 100; i++ {
		seen[r.MinLoad(all(3), l)]++
	}
	if seen[0] != 0 || seen[1] < 40 || seen[2] < 40 {
		t.Errorf("min-load spread %v", seen)
	}
}

func TestRingStableAndSpread(t *testing.T) {
	names := []string{"a", "b", "c", "d"}
	r := NewRing(names, []int{1, 1, 1, 1})
	l := NewLoads(4)
	m := all(4)
	count := make([]int, 4)
	for k := uint64(0); k < 40000; k++ {
		key := k * 0x9E3779B97F4A7C15
		ep := r.Pick(key, m, l, 1e9)
		if ep2 := r.Pick(key, m, l, 1e9); ep2 != ep {
			t.Fatal("unstable")
		}
		count[ep]++
	}
	for i, c := range count {
		if c < 7000 || c > 13000 {
			t.Errorf("endpoint %d got %d of 40000 keys", i, c)
		}
	}
	// Removing endpoint d moves only d's keys.
	m.Clear(3)
	for k := uint64(0); k < 4000; k++ {
		key := k * 0x9E3779B97F4A7C15
		before := r.Pick(key, all(4), l, 1e9)
		after := r.Pick(key, m, l, 1e9)
		if before != 3 && before != after {
			t.Fatalf("key %d moved %d -> %d", key, before, after)
		}
	}
}

// The bound is real: with every request sharing one key, no endpoint ever exceeds
// ceil((1+eps) x mean) of in-flight requests.
func TestRingBoundedLoad(t *testing.T) {
	names := []string{"a", "b", "c", "d"}
	r := NewRing(names, nil)
	l := NewLoads(4)
	m := all(4)
	const eps = 0.25
	for req := 1; req <= 200; req++ {
		ep := r.Pick(42, m, l, eps)
		if ep < 0 {
			t.Fatal("no endpoint")
		}
		l.Inc(ep)
		bound := int64(math.Ceil((1 + eps) * float64(req) / 4))
		for i := 0; i < 4; i++ {
			if l.Get(i) > bound {
				t.Fatalf("after %d requests endpoint %d has %d > bound %d", req, i, l.Get(i), bound)
			}
		}
	}
}

func TestRingWeights(t *testing.T) {
	r := NewRing([]string{"a", "b"}, []int{3, 1})
	l := NewLoads(2)
	count := make([]int, 2)
	for k := uint64(0); k < 20000; k++ {
		count[r.Pick(k*0x9E3779B97F4A7C15, all(2), l, 1e9)]++
	}
	if ratio := float64(count[0]) / float64(count[1]); ratio < 2.2 || ratio > 4 {
		t.Errorf("weight 3:1 gave %v", count)
	}
}

func TestPickAllocs(t *testing.T) {
	names := make([]string, 8)
	for i := range names {
		names[i] = fmt.Sprint("ep", i)
	}
	r := NewRing(names, nil)
	rr := NewRR(8)
	l := NewLoads(8)
	m := all(8)
	if n := testing.AllocsPerRun(100, func() {
		r.Pick(12345, m, l, 0.25)
		rr.Pick(m)
		rr.MinLoad(m, l)
	}); n != 0 {
		t.Errorf("picks allocate %v", n)
	}
}

func BenchmarkRingPick(b *testing.B) {
	names := make([]string, 8)
	for i := range names {
		names[i] = fmt.Sprint("ep", i)
	}
	r := NewRing(names, nil)
	l := NewLoads(8)
	m := all(8)
	b.ReportAllocs()
	var k uint64
	for b.Loop() {
		k += 0x9E3779B97F4A7C15
		r.Pick(k, m, l, 0.25)
	}
}

// Rebuild for a changed fleet: a vacant slot ("") has no points, and an endpoint joining
// a free slot takes keys only from the others, which keep the rest.
func TestRingRebuild(t *testing.T) {
	l := NewLoads(4)
	r := NewRing([]string{"a", "b", "", ""}, nil)
	before := make([]int, 4000)
	for k := range before {
		before[k] = r.Pick(uint64(k)*0x9E3779B97F4A7C15, all(4), l, 1e9)
		if before[k] > 1 {
			t.Fatalf("key %d on vacant slot %d", k, before[k])
		}
	}
	r.Rebuild([]string{"a", "b", "c", ""}, nil)
	moved := 0
	for k, was := range before {
		now := r.Pick(uint64(k)*0x9E3779B97F4A7C15, all(4), l, 1e9)
		switch {
		case now == 3:
			t.Fatalf("key %d on vacant slot 3", k)
		case now != was && now != 2:
			t.Fatalf("key %d moved %d -> %d, not to the new endpoint", k, was, now)
		case now != was:
			moved++
		}
	}
	if moved < 800 || moved > 1900 { // about a third
		t.Errorf("%d of 4000 keys moved to the new endpoint", moved)
	}
}
