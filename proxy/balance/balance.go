// Package balance holds kvgate's load-spreading selectors: round-robin, consistent
// hashing with bounded loads (CHWBL) and minimum in-flight load. Each picks one
// endpoint index among those set in an eligibility mask, allocating nothing.
package balance

import (
	"math"
	"math/bits"
	"slices"
	"sync/atomic"

	"github.com/kvgate/kvgate/shard"
	"github.com/zeebo/xxh3"
)

// Loads counts in-flight requests per endpoint, each on its own cache line.
type Loads struct {
	n     []paddedInt
	total atomic.Int64
}

type paddedInt struct {
	v atomic.Int64
	_ [56]byte
}

// NewLoads returns counters for n endpoints.
func NewLoads(n int) *Loads { return &Loads{n: make([]paddedInt, n)} }

// Inc counts one more in-flight request on ep.
func (l *Loads) Inc(ep int) { l.n[ep].v.Add(1); l.total.Add(1) }

// Dec counts one request on ep finished.
func (l *Loads) Dec(ep int) { l.n[ep].v.Add(-1); l.total.Add(-1) }

// Get is ep's in-flight count.
func (l *Loads) Get(ep int) int64 { return l.n[ep].v.Load() }

// Len is the number of endpoints.
func (l *Loads) Len() int { return len(l.n) }

// Bound is the bounded-load cap ceil((1+eps) x mean) over the eligible endpoints,
// counting the request being placed (so an idle pool always admits it).
func (l *Loads) Bound(eligible shard.Mask, eps float64) int64 {
	var sum int64
	n := 0
	forEach(eligible, len(l.n), func(i int) {
		sum += l.n[i].v.Load()
		n++
	})
	if n == 0 {
		return 0
	}
	return int64(math.Ceil((1 + eps) * float64(sum+1) / float64(n)))
}

// Under says whether one more request on ep stays within bound.
func (l *Loads) Under(ep int, bound int64) bool { return l.n[ep].v.Load()+1 <= bound }

func forEach(m shard.Mask, n int, fn func(i int)) {
	for w, word := range m {
		for word != 0 {
			i := w*64 + bits.TrailingZeros64(word)
			if i >= n {
				return
			}
			fn(i)
			word &= word - 1
		}
	}
}

// RR is round-robin over the eligible endpoints.
type RR struct {
	next atomic.Uint64
	n    int
}

// NewRR returns round-robin over n endpoints.
func NewRR(n int) *RR { return &RR{n: n} }

// Pick returns the next eligible endpoint, or -1 when none is. It counts turns over
// the eligible set, so an excluded endpoint's turn is not handed to its neighbour.
func (r *RR) Pick(eligible shard.Mask) int {
	c := countUpTo(eligible, r.n)
	if c == 0 {
		return -1
	}
	return nth(eligible, r.n, int((r.next.Add(1)-1)%uint64(c)))
}

// MinLoad returns the eligible endpoint with the fewest in-flight requests, breaking
// ties round-robin; -1 when none is eligible.
func (r *RR) MinLoad(eligible shard.Mask, loads *Loads) int {
	bestLoad, ties := int64(math.MaxInt64), 0
	forEach(eligible, r.n, func(i int) {
		switch l := loads.Get(i); {
		case l < bestLoad:
			bestLoad, ties = l, 1
		case l == bestLoad:
			ties++
		}
	})
	if ties == 0 {
		return -1
	}
	k := int((r.next.Add(1) - 1) % uint64(ties))
	best := -1
	forEach(eligible, r.n, func(i int) {
		if best < 0 && loads.Get(i) == bestLoad {
			if k == 0 {
				best = i
			}
			k--
		}
	})
	if best < 0 { // loads moved under us: any minimum will do
		best = nth(eligible, r.n, 0)
	}
	return best
}

func countUpTo(m shard.Mask, n int) int {
	c := 0
	forEach(m, n, func(int) { c++ })
	return c
}

func nth(m shard.Mask, n, k int) int {
	out := -1
	forEach(m, n, func(i int) {
		if k == 0 {
			out = i
		}
		k--
	})
	return out
}

// VNodesPerWeight is the number of ring points per unit of endpoint weight.
const VNodesPerWeight = 256

// Ring is a consistent-hash ring with bounded loads (Mirrokni et al., as in HAProxy's
// hash-balance-factor): a key maps to the first ring point clockwise whose endpoint is
// eligible and whose in-flight count would stay within ceil((1+eps) x mean).
type Ring struct {
	points atomic.Pointer[[]point] // swapped whole by Rebuild; Pick reads one snapshot
}

type point struct {
	hash uint64
	ep   int32
}

// NewRing builds the ring; weights[i] >= 1 is endpoint i's weight, names seed its points
// so adding an endpoint moves only the keys it takes.
func NewRing(names []string, weights []int) *Ring {
	r := &Ring{}
	r.Rebuild(names, weights)
	return r
}

// Rebuild replaces the ring's points for a changed endpoint set; an empty name is a
// vacant slot and has none. Names seed the points, so an endpoint that stays keeps its
// keys. Safe while Pick runs.
func (r *Ring) Rebuild(names []string, weights []int) {
	var pts []point
	var buf []byte
	for i, name := range names {
		if name == "" {
			continue
		}
		w := 1
		if i < len(weights) && weights[i] > 1 {
			w = weights[i]
		}
		for v := 0; v < VNodesPerWeight*w; v++ {
			buf = append(buf[:0], name...)
			buf = append(buf, '#', byte(v>>16), byte(v>>8), byte(v))
			pts = append(pts, point{hash: xxh3.Hash(buf), ep: int32(i)})
		}
	}
	slices.SortFunc(pts, func(a, b point) int {
		switch {
		case a.hash < b.hash:
			return -1
		case a.hash > b.hash:
			return 1
		}
		return int(a.ep - b.ep)
	})
	r.points.Store(&pts)
}

// Pick returns the endpoint for key, or -1 when no eligible endpoint is within bound.
func (r *Ring) Pick(key uint64, eligible shard.Mask, loads *Loads, eps float64) int {
	points := *r.points.Load()
	if len(points) == 0 {
		return -1
	}
	bound := loads.Bound(eligible, eps)
	i, _ := slices.BinarySearchFunc(points, key, func(p point, k uint64) int {
		switch {
		case p.hash < k:
			return -1
		case p.hash > k:
			return 1
		}
		return 0
	})
	for k := 0; k < len(points); k++ {
		j := i + k
		if j >= len(points) {
			j -= len(points)
		}
		ep := int(points[j].ep)
		if eligible.Has(ep) && loads.Under(ep, bound) {
			return ep
		}
	}
	return -1
}
