package ingest

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/hashcore"
	"github.com/kvgate/kvgate/shard"
)

// holderModel is what an endpoint holds by the events alone: per hash, the stores not
// yet removed on each tier (a removal on a tier without a holder takes nothing away).
type holderModel map[uint64]*[numMedia]int

func (m holderModel) store(t Medium, keys []uint64) {
	for _, k := range keys {
		if m[k] == nil {
			m[k] = new([numMedia]int)
		}
		m[k][t]++
	}
}

func (m holderModel) remove(t Medium, keys []uint64) {
	for _, k := range keys {
		if c := m[k]; c != nil && c[t] > 0 {
			c[t]--
		}
	}
}

// held lists the hashes held on a tier in tiers, sorted.
func (m holderModel) held(tiers Media) []uint64 {
	var out []uint64
	for k, c := range m {
		for t := Medium(0); t < numMedia; t++ {
			if tiers.Has(t) && c[t] > 0 {
				out = append(out, k)
				break
			}
		}
	}
	slices.Sort(out)
	return out
}

// heldKeys picks n of the hashes held on tier t, or any when none is.
func (m holderModel) heldKeys(r *rand.Rand, t Medium, n int, any func() uint64) []uint64 {
	var on []uint64
	for k, c := range m {
		if c[t] > 0 {
			on = append(on, k)
		}
	}
	slices.Sort(on) // map order is random: keep the stream a function of the seed
	out := make([]uint64, n)
	for i := range out {
		if len(on) == 0 || r.IntN(8) == 0 {
			out[i] = any() // a hash this tier does not hold (maybe never stored)
		} else {
			out[i] = on[r.IntN(len(on))]
		}
	}
	return out
}

var mediumNames = [numMedia]string{"", "CPU", "STORAGE", "EXTERNAL", "custom"}

// TestHoldersMatchModel: random streams of stores and removals on one rank, with repeated
// stores (vLLM's identical blocks), removals of hashes the tier does not hold, and, in
// some, blocks offloaded to other tiers from some point on, under several tier layouts.
// After every few batches the inventory's slots hold exactly the hashes the model holds
// on the tiers indexed there, and the tier counts are the model's distinct hashes per
// tier: whether the rank keeps its lone GPU holders as singles (the inventory bit) or
// every holder in its table, and across the switch from one to the other.
func TestHoldersMatchModel(t *testing.T) {
	for _, tc := range []struct {
		name      string
		routed    Media
		cpuSlot   bool
		offloadAt int // the op from which some events go to other tiers; -1: never
	}{
		{"gpu-only", 1 << MediumGPU, false, -1},
		{"gpu-then-cpu-slot", 1 << MediumGPU, true, 300},
		{"gpu-cpu-routed-later", 1<<MediumGPU | 1<<MediumCPU, false, 200},
		{"offload-from-start", 1 << MediumGPU, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv, err := shard.New(shard.Config{Endpoints: 8, Shards: 4})
			if err != nil {
				t.Fatal(err)
			}
			cfg := testConfig(inv)
			cfg.Routed = tc.routed
			ec := EndpointConfig{Name: "e", Engine: "vllm", Events: "tcp://127.0.0.1:1"}
			if tc.cpuSlot {
				ec.CPUSlots = []int{1}
			}
			m, err := NewManager(cfg, []EndpointConfig{ec})
			if err != nil {
				t.Fatal(err)
			}
			rk := m.eps[0].rk[0]
			if !rk.singlesOn {
				t.Fatal("a fresh rank over a shard.Inventory does not keep singles")
			}
			a := newApplier(m.eps[0], rk)
			r := rand.New(rand.NewPCG(uint64(len(tc.name)), 3))
			space := func() uint64 { return 1 + r.Uint64N(400) }
			model := holderModel{}
			for op := 0; op < 1500; op++ {
				tier := MediumGPU
				if tc.offloadAt >= 0 && op >= tc.offloadAt && r.IntN(3) == 0 {
					tier = Medium(1 + r.IntN(int(numMedia)-1))
				}
				n := 1 + r.IntN(12)
				var ev enginepub.Event
				if r.IntN(5) < 3 {
					keys := make([]uint64, n)
					for i := range keys {
						keys[i] = space()
						if i > 0 && r.IntN(10) == 0 {
							keys[i] = keys[r.IntN(i)] // a repeat within the batch
						}
					}
					model.store(tier, keys)
					ev = enginepub.BlockStored{Hashes: keys, BlockSize: 16, Medium: mediumNames[tier]}
				} else {
					keys := model.heldKeys(r, tier, n, space)
					model.remove(tier, keys)
					ev = enginepub.BlockRemoved{Hashes: keys, Medium: mediumNames[tier]}
				}
				if err := a.apply(fmtBatch(ev)); err != nil {
					t.Fatal(err)
				}
				if op%25 != 24 {
					continue
				}
				if got, want := invKeys(inv, 0), model.held(tc.routed); !slices.Equal(got, want) {
					t.Fatalf("op %d: slot 0 holds %d hashes, model %d\n got %v\nwant %v", op, len(got), len(want), got, want)
				}
				if tc.cpuSlot {
					if got, want := invKeys(inv, 1), model.held(1<<MediumCPU); !slices.Equal(got, want) {
						t.Fatalf("op %d: CPU slot holds %v, model %v", op, got, want)
					}
				}
				st := m.Status(0)
				for tier := Medium(0); tier < numMedia; tier++ {
					if got, want := st.Tiers[tier.String()], int64(len(model.held(1<<tier))); got != want {
						t.Fatalf("op %d: tier %v counts %d hashes, model %d (singles on %v)", op, tier, got, want, rk.singlesOn)
					}
				}
			}
			if on := tc.offloadAt < 0; rk.singlesOn != on {
				t.Fatalf("singles on %v after the stream, want %v", rk.singlesOn, on)
			}
		})
	}
}

// TestSinglesKeepTableEmpty: a GPU-only churn whose hashes each have one holder (the
// fleet's: new blocks stored, the oldest removed) leaves the rank's holder-count table
// unallocated; a repeated store gives that one hash an entry of two holders, and its
// first removal takes it back to a single, which the second removes.
func TestSinglesKeepTableEmpty(t *testing.T) {
	inv := newInv(t)
	m := startManagerless(t, inv)
	rk := m.eps[0].rk[0]
	a := newApplier(m.eps[0], rk)
	f := enginepub.Format{Flavor: enginepub.VLLM}
	for g := uint64(0); g < 200; g++ {
		ev := []enginepub.Event{enginepub.BlockStored{Hashes: groupOf(g), BlockSize: 16}}
		if g >= 20 {
			ev = append(ev, enginepub.BlockRemoved{Hashes: groupOf(g - 20)})
		}
		if err := a.apply(f.AppendBatch(nil, 1, ev)); err != nil {
			t.Fatal(err)
		}
	}
	if rk.refs.ents != nil || rk.singles != 20*16 || inv.Count(0) != 20*16 {
		t.Fatalf("after the churn: table allocated %v, %d singles, %d keys; want none, 320, 320", rk.refs.ents != nil, rk.singles, inv.Count(0))
	}
	k := groupOf(199)[3]
	a.apply(fmtBatch(stored(k)))
	if rk.refs.live != 1 || rk.singles != 20*16-1 {
		t.Fatalf("a repeated store: %d entries, %d singles; want 1 and 319", rk.refs.live, rk.singles)
	}
	a.apply(fmtBatch(enginepub.BlockRemoved{Hashes: []uint64{k}}))
	if rk.refs.live != 0 || rk.singles != 20*16 || inv.Count(0) != 20*16 {
		t.Fatalf("one of two holders removed: %d entries, %d singles, %d keys", rk.refs.live, rk.singles, inv.Count(0))
	}
	a.apply(fmtBatch(enginepub.BlockRemoved{Hashes: []uint64{k}}))
	if st := m.Status(0); inv.Count(0) != 20*16-1 || st.Tiers["GPU"] != 20*16-1 {
		t.Fatalf("both holders removed: %d keys, GPU tier %d", inv.Count(0), st.Tiers["GPU"])
	}
}

func startManagerless(t *testing.T, inv *shard.Inventory) *Manager {
	t.Helper()
	m, err := NewManager(testConfig(inv), []EndpointConfig{{Name: "e", Engine: "vllm", Events: "tcp://127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// groupOf is 16 distinct hashes of group g.
func groupOf(g uint64) []uint64 {
	out := make([]uint64, 16)
	for i := range out {
		out[i] = g<<8 | uint64(i) + 1
	}
	return out
}

// TestSinglesOffOverForeignKeys: a rank whose slot already holds keys when it is made
// (a route replica's fallback subscribing over the plane's inventory) does not take the
// inventory's word for who holds what: a store of a key the slot held, then its removal,
// removes it, as with no singles.
func TestSinglesOffOverForeignKeys(t *testing.T) {
	inv := newInv(t)
	inv.Add(0, []uint64{7, 8})
	m := startManagerless(t, inv)
	rk := m.eps[0].rk[0]
	if rk.singlesOn {
		t.Fatal("singles on over a slot that held keys")
	}
	a := newApplier(m.eps[0], rk)
	a.apply(fmtBatch(stored(7)))
	a.apply(fmtBatch(enginepub.BlockRemoved{Hashes: []uint64{7}}))
	if got := invKeys(inv, 0); !slices.Equal(got, []uint64{8}) {
		t.Fatalf("inventory %v, want [8]", got)
	}
}

// TestSinglesThroughSwitch: hashes kept as singles in engine mode get holder counts when
// a parity failure switches the endpoint to fast keys: a single stored again in fast
// mode has two holders, and leaves the inventory only with the second removal; a single
// removed leaves at once; the GPU tier count stays the distinct hashes held.
func TestSinglesThroughSwitch(t *testing.T) {
	m, inv, a, root := autoKeysEndpoint(t)
	rk := m.eps[0].rk[0]
	a.apply(fmtBatch(root)) // three blocks from the root, attested
	if rk.singles != 3 || rk.refs.live != 0 {
		t.Fatalf("before the switch: %d singles, %d entries", rk.singles, rk.refs.live)
	}
	other := enginepub.BlockStored{Hashes: []uint64{1, 2}, TokenIDs: testTokensN(32, 7), BlockSize: 16}
	a.apply(fmtBatch(other)) // keys the rule does not reproduce: the switch
	if st := m.Status(0); !st.Rehash || rk.singlesOn || st.Tiers["GPU"] != 5 {
		t.Fatalf("after the switch: %+v (singles on %v)", st, rk.singlesOn)
	}
	f := hashcore.NewFast(16)
	fk := hashcore.Keys(f, nil, root.TokenIDs[:48], nil)
	a.apply(fmtBatch(enginepub.BlockStored{Hashes: root.Hashes[:1], TokenIDs: root.TokenIDs[:16], BlockSize: 16})) // a second holder of block 0
	a.apply(fmtBatch(enginepub.BlockRemoved{Hashes: root.Hashes[:2]}))
	held := invKeys(inv, 0)
	if !slices.Contains(held, fk[0]) || slices.Contains(held, fk[1]) || !slices.Contains(held, fk[2]) {
		t.Fatalf("after removing blocks 0 (two holders) and 1: inventory %v, fast keys %v", held, fk)
	}
	a.apply(fmtBatch(enginepub.BlockRemoved{Hashes: root.Hashes[:1]}))
	if held := invKeys(inv, 0); slices.Contains(held, fk[0]) {
		t.Fatalf("block 0's second holder removed: inventory %v still holds %d", held, fk[0])
	}
	if st := m.Status(0); st.Tiers["GPU"] != 3 {
		t.Fatalf("GPU tier counts %d hashes, want 3 (block 2 and the two others)", st.Tiers["GPU"])
	}
}
