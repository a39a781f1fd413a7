package ingest

import (
	"testing"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/shard"
)

// The fleet's apply path without its network: 1,024 endpoints, each an engine whose
// cache is full (122 groups of 16 blocks, about 2M entries across the fleet, as
// `kvgate bench -fleet 1024` fills), each batch one BlockStored of 16 new blocks and one
// BlockRemoved of the endpoint's oldest 16, no token_ids (parity skipped: engine keys),
// the endpoints taking turns. What kvgate's CPU per applied key is in the fleet, less
// the read syscalls and the scheduler.
const (
	fleetBenchEndpoints = 1024
	fleetBenchKeep      = 122 // groups held per endpoint
	fleetBenchGroups    = 128 // groups cycled per endpoint: a ring of 128 batches
)

// fleetGroupKeys is group g of endpoint e: 16 distinct keys (splitmix64).
func fleetGroupKeys(e, g int) []uint64 {
	keys := make([]uint64, 16)
	for j := range keys {
		z := uint64(e)<<40 ^ uint64(g)<<8 ^ uint64(j) + 1
		z = z*0x9e3779b97f4a7c15 + 0x2545f4914f6cdd1d
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		keys[j] = z ^ z>>31
	}
	return keys
}

// fleetBench is a filled fleet and its ring of churn batches: batch t of endpoint e
// stores group (keep+t) mod groups and removes group t mod groups.
type fleetBench struct {
	inv      *shard.Inventory
	appliers []*applier
	batches  [][][]byte // [endpoint][t]
}

func newFleetBench(tb testing.TB) *fleetBench {
	inv, err := shard.New(shard.Config{Endpoints: fleetBenchEndpoints})
	if err != nil {
		tb.Fatal(err)
	}
	eps := make([]EndpointConfig, fleetBenchEndpoints)
	for i := range eps {
		eps[i] = EndpointConfig{Name: "e" + itoa(i), Index: i, Engine: "vllm", Events: "tcp://127.0.0.1:1"}
	}
	m, err := NewManager(Config{Inventory: inv, Keys: KeysAuto, Chain: vllmChain(tb)}, eps)
	if err != nil {
		tb.Fatal(err)
	}
	f := enginepub.Format{Flavor: enginepub.VLLM}
	fb := &fleetBench{inv: inv, batches: make([][][]byte, fleetBenchEndpoints)}
	for e := range eps {
		a := newApplier(m.eps[e], m.eps[e].rk[0])
		fb.appliers = append(fb.appliers, a)
		for g := 0; g < fleetBenchKeep; g++ {
			if err := a.apply(f.AppendBatch(nil, 1, []enginepub.Event{enginepub.BlockStored{Hashes: fleetGroupKeys(e, g), BlockSize: 16}})); err != nil {
				tb.Fatal(err)
			}
		}
		for t := 0; t < fleetBenchGroups; t++ {
			fb.batches[e] = append(fb.batches[e], f.AppendBatch(nil, 1, []enginepub.Event{
				enginepub.BlockStored{Hashes: fleetGroupKeys(e, (fleetBenchKeep+t)%fleetBenchGroups), BlockSize: 16},
				enginepub.BlockRemoved{Hashes: fleetGroupKeys(e, t%fleetBenchGroups)},
			}))
		}
	}
	return fb
}

func itoa(i int) string {
	var b [8]byte
	n := len(b)
	for {
		n--
		b[n] = byte('0' + i%10)
		if i /= 10; i == 0 {
			return string(b[n:])
		}
	}
}

// step applies the i-th batch of the churn (endpoints in turn).
func (fb *fleetBench) step(tb testing.TB, i int) {
	e, t := i%fleetBenchEndpoints, i/fleetBenchEndpoints%fleetBenchGroups
	if err := fb.appliers[e].apply(fb.batches[e][t]); err != nil {
		tb.Fatal(err)
	}
}

// BenchmarkFleetApply: one op decodes and applies one fleet batch (16 keys stored, 16
// removed); ns/key is per applied key. The first full turn of the ring warms every
// table to its churning size.
func BenchmarkFleetApply(b *testing.B) {
	fb := newFleetBench(b)
	warm := fleetBenchEndpoints * fleetBenchGroups
	for i := 0; i < warm; i++ {
		fb.step(b, i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		fb.step(b, warm+i)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(32*b.N), "ns/key")
}

// TestFleetApplyExact: after the churn, every endpoint holds exactly its last 122
// groups' keys (an independent count from the keys generated, not from the applier).
func TestFleetApplyExact(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a 2M-entry fleet")
	}
	fb := newFleetBench(t)
	const turns = fleetBenchGroups + 7 // past one full ring, ending mid-ring
	for i := 0; i < turns*fleetBenchEndpoints; i++ {
		fb.step(t, i)
	}
	for _, e := range []int{0, 1, 511, 1023} {
		if got := fb.inv.Count(e); got != fleetBenchKeep*16 {
			t.Errorf("endpoint %d holds %d keys, want %d", e, got, fleetBenchKeep*16)
		}
		held := map[uint64]bool{}
		for _, k := range invKeys(fb.inv, e) {
			held[k] = true
		}
		for g := turns; g < turns+fleetBenchKeep; g++ {
			for _, k := range fleetGroupKeys(e, g%fleetBenchGroups) {
				if !held[k] {
					t.Fatalf("endpoint %d lacks a key of group %d", e, g%fleetBenchGroups)
				}
			}
		}
	}
}
