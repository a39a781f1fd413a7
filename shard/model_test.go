package shard

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// model is the trivially correct inventory the property tests compare against:
// one set of keys per endpoint.
type model struct {
	eps []map[uint64]bool
}

func newModel(endpoints int) *model {
	m := &model{eps: make([]map[uint64]bool, endpoints)}
	for i := range m.eps {
		m.eps[i] = map[uint64]bool{}
	}
	return m
}

func (m *model) add(ep int, keys []uint64) int {
	n, _ := m.addHeld(ep, keys)
	return n
}

// addHeld is add, and the keys ep held already, sorted (a key repeated in keys is
// held from its second occurrence on).
func (m *model) addHeld(ep int, keys []uint64) (int, []uint64) {
	n := 0
	var held []uint64
	for _, k := range keys {
		if !m.eps[ep][k] {
			m.eps[ep][k] = true
			n++
		} else {
			held = append(held, k)
		}
	}
	slices.Sort(held)
	return n, held
}

func (m *model) remove(ep int, keys []uint64) int {
	n := 0
	for _, k := range keys {
		if m.eps[ep][k] {
			delete(m.eps[ep], k)
			n++
		}
	}
	return n
}

func (m *model) clearEndpoint(ep int) { m.eps[ep] = map[uint64]bool{} }

func (m *model) clearAll() {
	for i := range m.eps {
		m.clearEndpoint(i)
	}
}

func (m *model) len() int {
	u := map[uint64]bool{}
	for _, s := range m.eps {
		for k := range s {
			u[k] = true
		}
	}
	return len(u)
}

// score is Score's definition written the obvious way.
func (m *model) score(keys []uint64, eligible Mask, mode Mode, n int) (scores []int32, best, second int) {
	scores = make([]int32, len(m.eps))
	best, second = -1, -1
	for ep := 0; ep < n; ep++ {
		if !eligible.Has(ep) || len(m.eps[ep]) == 0 {
			continue // an empty endpoint scores 0 (and ranks below): skip the walk
		}
		for _, k := range keys {
			if m.eps[ep][k] {
				scores[ep]++
			} else if mode == Prefix {
				break
			}
		}
	}
	for ep := 0; ep < n; ep++ {
		if !eligible.Has(ep) {
			continue
		}
		switch {
		case best < 0 || scores[ep] > scores[best]:
			second, best = best, ep
		case second < 0 || scores[ep] > scores[second]:
			second = ep
		}
	}
	return scores, best, second
}

func (m *model) sortedKeys(ep int) []uint64 {
	out := make([]uint64, 0, len(m.eps[ep]))
	for k := range m.eps[ep] {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// listAll pages through Keys with the given page size.
func listAll(t testing.TB, inv *Inventory, ep, limit int) []uint64 {
	t.Helper()
	// A compaction a test's last write started may publish between pages, and Keys may
	// then list a key twice or miss it: list one table per shard.
	inv.waitCompactions()
	var out []uint64
	var cursor uint64
	for pages := 0; ; pages++ {
		if pages > 1<<22 {
			t.Fatalf("Keys(%d) did not terminate", ep)
		}
		before := len(out)
		out, cursor = inv.Keys(ep, cursor, limit, out)
		if limit > 0 && len(out)-before > limit {
			t.Fatalf("Keys returned %d keys, limit %d", len(out)-before, limit)
		}
		if cursor == 0 {
			break
		}
	}
	slices.Sort(out)
	return out
}

// keySpace mixes small integers (including key 0, the empty-slot marker's value) with
// random 64-bit keys, so the same keys come back often (re-adds, tombstone revival) and
// tables grow and shrink through rebuilds.
func keySpace(r *rand.Rand, n int) []uint64 {
	ks := make([]uint64, n)
	for i := range ks {
		if i < n/4 {
			ks[i] = uint64(i)
		} else {
			ks[i] = r.Uint64()
		}
	}
	return ks
}

func pick(r *rand.Rand, ks []uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = ks[r.IntN(len(ks))]
	}
	return out
}

func TestPropertyAgainstModel(t *testing.T) {
	for _, tc := range []modelCase{
		{1, 1, 300, 3000},
		{5, 2, 1500, 6000},
		{8, 0, 3000, 6000},
		{16, 2, 2000, 5000},
		{32, 4, 2000, 5000},
		{8, 1, 5000, 4000},
		{64, 4, 3000, 4000},
		{65, 2, 2000, 3000},
		{200, 8, 3000, 3000},
		{1024, 16, 1500, 2000},
		// Fleet rules: a large key space (keys held by one to a few endpoints, inline
		// sets) and a small one (keys held by many, spilled and unspilled again).
		{1024, 4, 20000, 3000},
		{512, 2, 60, 3000},
		{65, 1, 40, 3000},
	} {
		// Each case twice: tables rebuilt under the mutex (these are small) and every
		// table compacted in the background (compact.go) while the ops go on.
		for _, minSlots := range []int{compactMinSlots, 0} {
			t.Run(fmt.Sprintf("endpoints=%d/compact-min=%d", tc.endpoints, minSlots), func(t *testing.T) {
				propertyAgainstModel(t, tc, minSlots)
			})
		}
	}
}

type modelCase struct{ endpoints, shards, keySpace, ops int }

func propertyAgainstModel(t *testing.T, tc modelCase, compactMin int) {
	r := rand.New(rand.NewPCG(uint64(tc.endpoints), uint64(tc.shards)))
	inv, err := New(Config{Endpoints: tc.endpoints, Shards: tc.shards})
	if err != nil {
		t.Fatal(err)
	}
	inv.compactMinSlots = compactMin
	m := newModel(tc.endpoints)
	ks := keySpace(r, tc.keySpace)
	scores := make([]int32, tc.endpoints)
	maxSpilled := int64(0)
	var heldBuf []uint64
	for op := 0; op < tc.ops; op++ {
		ep := r.IntN(tc.endpoints)
		switch x := r.IntN(1000); {
		case x < 600:
			keys := pick(r, ks, 1+r.IntN(40))
			if r.IntN(2) == 0 {
				if got, want := inv.Add(ep, keys), m.add(ep, keys); got != want {
					t.Fatalf("op %d: Add(%d) = %d, model %d", op, ep, got, want)
				}
				break
			}
			got, held := inv.AddHeld(ep, keys, heldBuf[:0])
			want, wantHeld := m.addHeld(ep, keys)
			heldBuf = held
			slices.Sort(held)
			if got != want || !slices.Equal(held, wantHeld) {
				t.Fatalf("op %d: AddHeld(%d) = %d, held %v; model %d, %v", op, ep, got, held, want, wantHeld)
			}
		case x < 990:
			keys := pick(r, ks, 1+r.IntN(60))
			if r.IntN(2) == 0 {
				keys = m.sortedKeys(ep)
				r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
				keys = keys[:len(keys)/2]
			}
			if got, want := inv.Remove(ep, keys), m.remove(ep, keys); got != want {
				t.Fatalf("op %d: Remove(%d) = %d, model %d", op, ep, got, want)
			}
		case x < 998:
			inv.ClearEndpoint(ep)
			m.clearEndpoint(ep)
		default:
			inv.ClearAll()
			m.clearAll()
		}
		if op%50 == 0 || op == tc.ops-1 {
			checkAgainstModel(t, r, inv, m, ks, scores)
			maxSpilled = max(maxSpilled, inv.Stats().Spilled)
		}
	}
	if tc.endpoints > 64 && tc.keySpace <= 100 && maxSpilled == 0 {
		t.Fatal("no endpoint set ever spilled: the case misses the spilled representation")
	}
}

func checkAgainstModel(t *testing.T, r *rand.Rand, inv *Inventory, m *model, ks []uint64, scores []int32) {
	t.Helper()
	inv.waitCompactions()
	n := inv.Endpoints()
	if got, want := inv.Len(), m.len(); got != want {
		t.Fatalf("Len = %d, model %d", got, want)
	}
	for ep := 0; ep < n; ep++ {
		if got, want := inv.Count(ep), len(m.eps[ep]); got != want {
			t.Fatalf("Count(%d) = %d, model %d", ep, got, want)
		}
	}
	for i := 0; i < 3; i++ {
		ep := r.IntN(n)
		if got, want := listAll(t, inv, ep, r.IntN(50)), m.sortedKeys(ep); !slices.Equal(got, want) {
			t.Fatalf("Keys(%d): %d keys, model %d", ep, len(got), len(want))
		}
	}
	for i := 0; i < 8; i++ {
		// Chains biased toward one endpoint's keys so prefix runs are long.
		var keys []uint64
		if held := m.sortedKeys(r.IntN(n)); len(held) > 0 && r.IntN(3) > 0 {
			for j := 0; j < 1+r.IntN(30); j++ {
				keys = append(keys, held[r.IntN(len(held))])
			}
		}
		keys = append(keys, pick(r, ks, r.IntN(20))...)
		elig := NewMask(n)
		switch r.IntN(3) {
		case 0:
			elig.SetAll(n)
		case 1:
			for ep := 0; ep < n; ep++ {
				if r.IntN(2) == 0 {
					elig.Set(ep)
				}
			}
		default:
			elig.Set(r.IntN(n))
		}
		for _, mode := range []Mode{Overlap, Prefix} {
			for j := range scores {
				scores[j] = -7 // Score must zero every slot it owns
			}
			best, second := inv.Score(keys, elig, mode, scores)
			want, wb, ws := m.score(keys, elig, mode, n)
			if !slices.Equal(scores, want) || best != wb || second != ws {
				t.Fatalf("Score(%v, %d keys): best %d second %d scores %v\nmodel best %d second %d scores %v",
					mode, len(keys), best, second, scores, wb, ws, want)
			}
		}
	}
	st := inv.Stats()
	if st.Keys != int64(m.len()) || st.MemoryBytes != inv.MemoryBytes() || st.Slots < st.Keys-1 {
		t.Fatalf("Stats inconsistent: %+v", st)
	}
}
