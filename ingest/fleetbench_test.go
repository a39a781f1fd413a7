package ingest

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/internal/testfix"
	"github.com/kvgate/kvgate/shard"
)

// The fleet's apply path without its network: 1,024 endpoints, each an engine whose
// cache is full (122 groups of 16 blocks, about 2M entries across the fleet, as
// `kvgate bench -fleet 1024` fills), each batch one BlockStored of 16 new blocks (keys
// never seen before, as the fleet's) and one BlockRemoved of the endpoint's oldest 16,
// no token_ids (parity skipped: engine keys), the endpoints taking turns. What kvgate's
// CPU per applied key is in the fleet, less the read syscalls and the scheduler.
const (
	fleetBenchEndpoints = 1024
	fleetBenchKeep      = 122 // groups held per endpoint
)

// fleetBenchGroups is the groups each endpoint holds: fleetBenchKeep, or FLEET_ENTRIES's
// millions of entries across the 1,024 endpoints (FLEET_ENTRIES=100M: the fleet).
func fleetBenchGroups(tb testing.TB) int {
	spec := os.Getenv("FLEET_ENTRIES")
	if spec == "" {
		return fleetBenchKeep
	}
	n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(spec), "M"))
	if err != nil || n <= 0 {
		tb.Fatalf("FLEET_ENTRIES: %q is not one count of millions like 100M", spec)
	}
	return n * 1e6 / fleetBenchEndpoints / 16
}

// fleetGroupKeys appends group g of endpoint e to dst: 16 distinct keys (splitmix64).
func fleetGroupKeys(dst []uint64, e, g int) []uint64 {
	for j := 0; j < 16; j++ {
		z := uint64(e)<<40 ^ uint64(g)<<8 ^ uint64(j) + 1
		z = z*0x9e3779b97f4a7c15 + 0x2545f4914f6cdd1d
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		dst = append(dst, z^z>>31)
	}
	return dst
}

// fleetBench is a filled fleet; round r's batch of endpoint e stores group keep+r and
// removes group r.
type fleetBench struct {
	keep     int // groups held per endpoint
	inv      *shard.Inventory
	appliers []*applier
	f        enginepub.Format
	round    int
	batches  [][]byte // the current round's, one per endpoint
	st, rm   []uint64
}

func newFleetBench(tb testing.TB, endpoints, keep int) *fleetBench {
	inv, err := shard.New(shard.Config{Endpoints: endpoints})
	if err != nil {
		tb.Fatal(err)
	}
	eps := make([]EndpointConfig, endpoints)
	for i := range eps {
		eps[i] = EndpointConfig{Name: "e" + itoa(i), Index: i, Engine: "vllm", Events: "tcp://127.0.0.1:1"}
	}
	m, err := NewManager(Config{Inventory: inv, Keys: KeysAuto, Chain: vllmChain(tb)}, eps)
	if err != nil {
		tb.Fatal(err)
	}
	fb := &fleetBench{keep: keep, inv: inv, f: enginepub.Format{Flavor: enginepub.VLLM}, batches: make([][]byte, endpoints)}
	for e := range eps {
		a := newApplier(m.eps[e], m.eps[e].rk[0])
		fb.appliers = append(fb.appliers, a)
		for g := 0; g < keep; g++ {
			fb.st = fleetGroupKeys(fb.st[:0], e, g)
			if err := a.apply(fb.f.AppendBatch(nil, 1, []enginepub.Event{enginepub.BlockStored{Hashes: fb.st, BlockSize: 16}})); err != nil {
				tb.Fatal(err)
			}
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

// encodeRound encodes the next round's batches.
func (fb *fleetBench) encodeRound() {
	r := fb.round
	fb.round++
	for e := range fb.batches {
		fb.st = fleetGroupKeys(fb.st[:0], e, fb.keep+r)
		fb.rm = fleetGroupKeys(fb.rm[:0], e, r)
		fb.batches[e] = fb.f.AppendBatch(fb.batches[e][:0], 1, []enginepub.Event{
			enginepub.BlockStored{Hashes: fb.st, BlockSize: 16}, enginepub.BlockRemoved{Hashes: fb.rm}})
	}
}

// applyRound applies the current round's batches, endpoints in turn, appending each
// batch's apply time to times when it is not nil.
func (fb *fleetBench) applyRound(tb testing.TB, times *[]time.Duration) {
	for e, a := range fb.appliers {
		var t0 time.Time
		if times != nil {
			t0 = time.Now()
		}
		if err := a.apply(fb.batches[e]); err != nil {
			tb.Fatal(err)
		}
		if times != nil {
			*times = append(*times, time.Since(t0))
		}
	}
}

// BenchmarkFleetApply: one op decodes and applies one fleet batch (16 keys stored, 16
// removed); ns/key is per applied key, cpu-ns/key the process's CPU time per key, and
// the per-batch apply time's p50, p99 and p99.9. A round is encoded with the timer stopped; 128
// rounds first (every endpoint's tables at their churning size, shard tables past
// their first compactions).
func BenchmarkFleetApply(b *testing.B) {
	fb := newFleetBench(b, fleetBenchEndpoints, fleetBenchGroups(b))
	for r := 0; r < 128; r++ {
		fb.encodeRound()
		fb.applyRound(b, nil)
	}
	s0 := fb.inv.Stats()
	b.ReportAllocs()
	b.ResetTimer()
	rounds := (b.N + fleetBenchEndpoints - 1) / fleetBenchEndpoints
	var cpu int64
	times := make([]time.Duration, 0, rounds*fleetBenchEndpoints)
	for r := 0; r < rounds; r++ {
		b.StopTimer()
		fb.encodeRound()
		b.StartTimer()
		c0 := testfix.ProcessCPU()
		fb.applyRound(b, &times)
		cpu += testfix.ProcessCPU() - c0
	}
	b.StopTimer()
	// Per-batch apply time (wall: on a busy machine its tail includes waits for a core).
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Nanoseconds()), "p50-ns/batch")
	b.ReportMetric(float64(times[len(times)*99/100].Nanoseconds()), "p99-ns/batch")
	b.ReportMetric(float64(times[len(times)*999/1000].Nanoseconds()), "p99.9-ns/batch")
	b.ReportMetric(float64(times[len(times)-1].Nanoseconds()), "max-ns/batch")
	keys := float64(32 * rounds * fleetBenchEndpoints)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/keys, "ns/key")
	// CPU time per key: what the busy shared machine inflates least (wall time also
	// counts the time this thread waited for a core).
	b.ReportMetric(float64(cpu)/keys, "cpu-ns/key")
	b.ReportMetric(float64(fb.inv.Stats().Rebuilds-s0.Rebuilds)/keys*1e6, "rebuilds/Mkey")
}

// TestFleetApplyExact: after the churn, endpoints hold exactly their last 122 groups'
// keys (an independent count from the keys generated, not from the applier), in a
// fleet of 65 endpoints (the sparse fleet layout; the benchmark's 1,024 would make the
// race-detector run minutes long).
func TestFleetApplyExact(t *testing.T) {
	fb := newFleetBench(t, 65, fleetBenchKeep)
	const rounds = 150 // past every first group
	for r := 0; r < rounds; r++ {
		fb.encodeRound()
		fb.applyRound(t, nil)
	}
	for _, e := range []int{0, 1, 32, 64} {
		if got := fb.inv.Count(e); got != fleetBenchKeep*16 {
			t.Errorf("endpoint %d holds %d keys, want %d", e, got, fleetBenchKeep*16)
		}
		held := map[uint64]bool{}
		for _, k := range invKeys(fb.inv, e) {
			held[k] = true
		}
		for g := rounds; g < rounds+fleetBenchKeep; g++ {
			for _, k := range fleetGroupKeys(nil, e, g) {
				if !held[k] {
					t.Fatalf("endpoint %d lacks a key of group %d", e, g)
				}
			}
		}
	}
}
