package ingest

import (
	"math/rand/v2"
	"testing"
)

// refOracle is the holder counts a refTable must report, by brute force: a map of
// per-tier counts, saturating at refMax as the table's fields do.
type refOracle map[uint64]*[numMedia]int

func (o refOracle) holders(k uint64) Media {
	var s Media
	if c := o[k]; c != nil {
		for m := Medium(0); m < numMedia; m++ {
			if c[m] != 0 {
				s |= 1 << m
			}
		}
	}
	return s
}

// checkRefInvariants recomputes what the table keeps incrementally: its live entries and
// every set's spill (the entries past it whose probe from their home passed it), and
// that each entry is findable from its home.
func checkRefInvariants(t *testing.T, rt *refTable) {
	t.Helper()
	if rt.ents == nil {
		return
	}
	live := 0
	spill := make([]uint32, rt.sets)
	for idx, e := range rt.ents {
		if idx%refWays == 0 || e.counts == 0 {
			continue // a set's header, or a free way
		}
		live++
		at := uint64(idx / refWays)
		for p := rt.home(e.key); p != at; p = (p + 1) & rt.mask {
			spill[p]++
		}
		if rt.find(e.key) != &rt.ents[idx] {
			t.Fatalf("key %#x in set %d is not found from its home %d", e.key, at, rt.home(e.key))
		}
	}
	if live != rt.live {
		t.Fatalf("live %d, entries in use %d", rt.live, live)
	}
	for i := range spill {
		if uint64(spill[i]) != *rt.spill(uint64(i)) {
			t.Fatalf("set %d: spill %d, recomputed %d", i, *rt.spill(uint64(i)), spill[i])
		}
	}
}

// TestRefTableMatchesOracle: random stores and removals on every tier, over keys that
// repeat (several holders) and keys that crowd a few home sets (probing past full sets),
// report exactly what a map of counts says, below capacity (nothing forgotten) and at
// it (a forgotten key is one the oracle then drops, and the table said whose holders it
// dropped).
func TestRefTableMatchesOracle(t *testing.T) {
	for _, tc := range []struct {
		name     string
		capacity int
		keys     int
		crowd    bool // keys share few home sets
	}{
		{"below-capacity", 1 << 14, 3000, false},
		{"crowded-homes", 1 << 14, 600, true},
		{"at-capacity", 256, 2000, false},
		{"at-capacity-crowded", 256, 400, true},
		{"one-set", 1, 40, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, uint64(tc.keys)))
			rt := newRefTable(tc.capacity)
			pool := make([]uint64, tc.keys)
			for i := range pool {
				pool[i] = r.Uint64() | 1
			}
			if tc.crowd {
				// Keys whose homes at every size up to 4,096 sets are sets 0-3: random
				// keys, kept when the bits the home takes are small.
				const maxMask = 1<<12 - 1
				for i := 0; i < len(pool); {
					k := r.Uint64() | 1
					if ((k*0xD6E8FEB86659FD93)>>32)&maxMask < 4 {
						pool[i] = k
						i++
					}
				}
			}
			o := refOracle{}
			for op := 0; op < 40*tc.keys; op++ {
				k := pool[r.IntN(len(pool))]
				m := Medium(r.IntN(int(numMedia)))
				if r.IntN(2) == 0 {
					c := o[k]
					fresh := c == nil || c[m] == 0
					ev0 := rt.evicted
					gotFresh, dropped := rt.inc(k, m)
					if gotFresh != fresh {
						t.Fatalf("op %d: inc(%#x, %v) new %v, oracle %v", op, k, m, gotFresh, fresh)
					}
					if c == nil {
						c = new([numMedia]int)
						o[k] = c
					}
					c[m] = min(c[m]+1, refMax)
					if rt.evicted != ev0 {
						if rt.slots() < rt.cap {
							t.Fatalf("op %d: evicted below capacity (%d slots of %d)", op, rt.slots(), rt.cap)
						}
						// Exactly one oracle key is no longer in the table: the evicted one.
						var gone []uint64
						for ok := range o {
							if rt.find(ok) == nil {
								gone = append(gone, ok)
							}
						}
						if len(gone) != 1 || o.holders(gone[0]) != dropped {
							t.Fatalf("op %d: evicted %d keys %x, dropped %v", op, len(gone), gone, dropped)
						}
						delete(o, gone[0])
					} else if dropped != 0 {
						t.Fatalf("op %d: dropped %v without an eviction", op, dropped)
					}
				} else {
					c := o[k]
					known, gone, left := rt.dec(k, m)
					switch {
					case c == nil:
						if known || !gone || left != 0 {
							t.Fatalf("op %d: dec of unknown %#x: %v %v %v", op, k, known, gone, left)
						}
						continue
					case c[m] == 0:
						if !known || gone || left != o.holders(k) {
							t.Fatalf("op %d: dec of %#x with no holder on %v: %v %v %v", op, k, m, known, gone, left)
						}
						continue
					case c[m] != refMax:
						c[m]--
					}
					if !known || gone != (c[m] == 0) || left != o.holders(k) {
						t.Fatalf("op %d: dec(%#x, %v): known %v gone %v left %v, oracle %v %v", op, k, m, known, gone, left, c[m], o.holders(k))
					}
					if left == 0 {
						delete(o, k)
					}
				}
				if op%97 == 0 {
					checkRefInvariants(t, &rt)
				}
			}
			checkRefInvariants(t, &rt)
			var n [numMedia]int64
			rt.countTiers(&n)
			var want [numMedia]int64
			for _, c := range o {
				for m := Medium(0); m < numMedia; m++ {
					if c[m] != 0 {
						want[m]++
					}
				}
			}
			if n != want {
				t.Fatalf("countTiers %v, oracle %v", n, want)
			}
		})
	}
}

// TestRefTableChurnStaysSmall: an endpoint whose cache is full (a steady 2,000 hashes,
// each store a new one, each removal the oldest) keeps a table at most four slots per
// hash however long it churns, and stops allocating. The earlier grow-at-first-full-set
// policy reached 32,768 slots for the same 2,000 hashes.
func TestRefTableChurnStaysSmall(t *testing.T) {
	rt := newRefTable(1 << 17)
	const live = 2000
	r := rand.New(rand.NewPCG(2, 3))
	q := make([]uint64, 0, live+1)
	step := func() {
		k := r.Uint64()
		rt.inc(k, MediumGPU)
		q = append(q, k)
		if len(q) > live {
			if known, gone, _ := rt.dec(q[0], MediumGPU); !known || !gone {
				t.Fatalf("oldest hash: known %v gone %v", known, gone)
			}
			q = append(q[:0], q[1:]...)
		}
	}
	for i := 0; i < 200_000; i++ {
		step()
	}
	if rt.slots() > 4*live || rt.evicted != 0 {
		t.Fatalf("%d slots for %d hashes, %d evicted", rt.slots(), live, rt.evicted)
	}
	checkRefInvariants(t, &rt)
	if allocs := testing.AllocsPerRun(1000, step); allocs != 0 {
		t.Fatalf("%.2f allocs per churn step", allocs)
	}
}
