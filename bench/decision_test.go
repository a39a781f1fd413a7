package bench

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/hashcore"
	"github.com/kvgate/kvgate/internal/testfix"
	"github.com/kvgate/kvgate/proxy/balance"
	"github.com/kvgate/kvgate/proxy/route"
	"github.com/kvgate/kvgate/shard"
)

// The decision: hash an 8,192-token prompt into its vLLM sha256_cbor block keys (512
// blocks of 16) and score them against a 1M-key inventory of 8 endpoints, with the
// buffers a request would reuse. Tokenizing is not included. Target: <= 60 us and
// 0 allocs/op (DESIGN.md targets).
//
// Inventory: 1M keys. Endpoint 3 holds the prompt's first 384 blocks (a cached system
// prompt plus history); endpoint 5 holds its first 128; the remaining keys are random,
// spread over all 8 endpoints, one in four held by two.

const (
	decisionTokens    = 8192
	decisionEndpoints = 8
	decisionInventory = 1 << 20
)

type decisionFixture struct {
	chain  hashcore.Chain
	inv    *shard.Inventory
	tokens []uint32
	elig   shard.Mask
}

var (
	decisionOnce sync.Once
	decisionFix  decisionFixture
	decisionErr  error
)

// decisionPromptTokens is a deterministic prompt of token ids below a 152k vocabulary.
func decisionPromptTokens(n int) []uint32 {
	t := make([]uint32, n)
	x := uint32(2463534242)
	for i := range t {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		t[i] = x % 151936
	}
	return t
}

// decisionKey is the i-th filler key (splitmix64).
func decisionKey(i uint64) uint64 {
	z := i*0x9e3779b97f4a7c15 + 0x1234567
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

func decisionSetup(tb testing.TB) *decisionFixture {
	decisionOnce.Do(func() {
		c, err := hashcore.New(hashcore.Spec{Engine: "vllm", Algo: "sha256_cbor", BlockSize: 16})
		if err != nil {
			decisionErr = err
			return
		}
		inv, err := shard.New(shard.Config{Endpoints: decisionEndpoints})
		if err != nil {
			decisionErr = err
			return
		}
		tokens := decisionPromptTokens(decisionTokens)
		keys := hashcore.Keys(c, nil, tokens, nil)
		inv.Add(3, keys[:384])
		inv.Add(5, keys[:128])
		batch := make([]uint64, 0, 256)
		for i := uint64(0); inv.Len() < decisionInventory; i++ {
			batch = append(batch, decisionKey(i))
			if len(batch) == cap(batch) {
				inv.Add(int(i/256)%decisionEndpoints, batch)
				if i%1024 < 256 {
					inv.Add(int(i/256+3)%decisionEndpoints, batch[:64])
				}
				batch = batch[:0]
			}
		}
		elig := shard.NewMask(decisionEndpoints)
		elig.SetAll(decisionEndpoints)
		decisionFix = decisionFixture{chain: c, inv: inv, tokens: tokens, elig: elig}
	})
	if decisionErr != nil {
		tb.Fatal(decisionErr)
	}
	return &decisionFix
}

// decide is the decision as the request path makes it, into reused buffers.
func (f *decisionFixture) decide(keys []uint64, scores []int32) ([]uint64, int, int) {
	keys = hashcore.Keys(f.chain, keys[:0], f.tokens, nil)
	best, second := f.inv.Score(keys, f.elig, shard.Overlap, scores)
	return keys, best, second
}

func BenchmarkDecision(b *testing.B) {
	b.Run("tokens=8192/endpoints=8", func(b *testing.B) {
		f := decisionSetup(b)
		keys := make([]uint64, 0, decisionTokens/16)
		scores := make([]int32, decisionEndpoints)
		var best, second int
		b.ReportAllocs()
		for b.Loop() {
			keys, best, second = f.decide(keys, scores)
		}
		if len(keys) != decisionTokens/16 || best != 3 || second != 5 || scores[3] != 384 || scores[5] != 128 {
			b.Fatalf("decision: %d keys, best %d second %d, scores %v; want 512 keys, 3 (384), 5 (128)",
				len(keys), best, second, scores)
		}
		b.ReportMetric(float64(f.inv.Len()), "inventory-keys")
	})
	b.Run("tokens=8192/endpoints=1024", func(b *testing.B) {
		f := fleetDecisionSetup(b)
		d := newFleetDecision()
		w, v := -1, 0
		b.ReportAllocs()
		clock := testfix.StartCPUClock()
		for b.Loop() {
			w = f.decide(d, v)
			v++
		}
		clock.Stop(b, b.N)
		if w != 5 || d.scores[5] != 384 || d.scores[300] != 256 || d.scores[900] != 128 {
			b.Fatalf("decision: endpoint %d, scores 5:%d 300:%d 900:%d; want 5 (384, 256, 128)",
				w, d.scores[5], d.scores[300], d.scores[900])
		}
		b.ReportMetric(float64(f.entries)/1e6, "Mentries")
	})
}

// TestDecisionAllocatesNothing backs BenchmarkDecision's 0 allocs/op claim, and checks
// the decision itself: the endpoint holding the longest cached run wins.
func TestDecisionAllocatesNothing(t *testing.T) {
	f := decisionSetup(t)
	keys := make([]uint64, 0, decisionTokens/16)
	scores := make([]int32, decisionEndpoints)
	keys, best, second := f.decide(keys, scores)
	if len(keys) != 512 || best != 3 || second != 5 || scores[3] != 384 || scores[5] != 128 {
		t.Fatalf("decision: %d keys, best %d second %d, scores %v", len(keys), best, second, scores)
	}
	if a := testing.AllocsPerRun(20, func() { keys, _, _ = f.decide(keys, scores) }); a != 0 {
		t.Fatalf("%.1f allocs per decision, want 0", a)
	}
}

// BenchmarkDecisionStages splits BenchmarkDecision into its two stages, so a miss of the
// target can be put on the stage that causes it.
func BenchmarkDecisionStages(b *testing.B) {
	f := decisionSetup(b)
	keys := hashcore.Keys(f.chain, make([]uint64, 0, decisionTokens/16), f.tokens, nil)
	scores := make([]int32, decisionEndpoints)
	b.Run("hash/tokens=8192", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			keys = hashcore.Keys(f.chain, keys[:0], f.tokens, nil)
		}
	})
	for _, mode := range []shard.Mode{shard.Overlap, shard.Prefix} {
		b.Run("score/"+mode.String()+"/keys=512/endpoints=8", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				f.inv.Score(keys, f.elig, mode, scores)
			}
		})
	}
}

// The fleet decision (issue 13): an 8,192-token prompt (one of fleetDecisionPrompts), hashed cold, scored against
// a 1,024-endpoint inventory of fleetDecisionEntries() (key, endpoint) entries, then the
// cost policy (fair share and the followers sketch on, as kvgate serve builds it) over
// all 1,024 with queue state on every endpoint. Target: <= 80 us and 0 allocs/op.
//
// Inventory: endpoint 5 holds each prompt's first 384 blocks, 300 its first 256, 900 its
// first 128; every other key is a filler held by 1 (45%), 2 (30%), 3 (15%), 4 (6%), 8
// (3%) or 32 (1%) distinct endpoints (shard's BenchmarkFleet workload: 2.3 holders a key,
// 4% spilled), in per-endpoint batches of 64 as BlockStored events bring them. Entries:
// FLEET_ENTRIES (millions, e.g. 100M; one size) or 10M, which builds in well under a
// minute.
//
// Queues: every endpoint has 100 x (i mod 7) prefill tokens of kvgate's in flight, 0-2
// requests in flight, a mean request time; every other one a fresh engine report of 0-11
// running and 0-2 waiting with 8 slots, so some predict a wait for a batch slot.
const fleetDecisionEndpoints = 1024

// fleetDecisionPrompts is how many distinct prompts the benchmark rotates, each with its
// own keys and holders: a repeated prompt would find its 512 buckets still cached from the
// last iteration, which no request of a real fleet does (2 MiB of lines, 128 MiB of pages).
const fleetDecisionPrompts = 256

type fleetDecisionFixture struct {
	chain   hashcore.Chain
	inv     *shard.Inventory
	prompts [][]uint32 // fleetDecisionPrompts of them, each held as the comment above says
	elig    shard.Mask
	cost    *route.Cost
	entries int
}

var (
	fleetDecisionOnce sync.Once
	fleetDecisionFix  fleetDecisionFixture
	fleetDecisionErr  error
)

func fleetDecisionEntries() (int, error) {
	spec := os.Getenv("FLEET_ENTRIES")
	if spec == "" {
		return 10e6, nil
	}
	n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(spec), "M"))
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("FLEET_ENTRIES: %q is not one count of millions like 100M", spec)
	}
	return n * 1e6, nil
}

// fleetDecisionSpec is the fleet fixture's engine contract: vLLM's sha256_cbor, or the
// prefix_caching_hash_algo FLEET_DECISION_ALGO names (sha256, sha256_cbor, xxhash,
// xxhash_cbor; the xxhash ones with PYTHONHASHSEED=0), so the decision's hash stage can be
// read for each hash a fleet may run.
func fleetDecisionSpec() hashcore.Spec {
	algo := os.Getenv("FLEET_DECISION_ALGO")
	if algo == "" {
		algo = "sha256_cbor"
	}
	s := hashcore.Spec{Engine: "vllm", Algo: algo, BlockSize: 16}
	if strings.HasPrefix(algo, "xxhash") {
		s.Seed, s.SeedSet = "0", true // vLLM refuses parity for them without a seed
	}
	return s
}

// fleetDecisionHolders appends filler key i's distinct holders to dst.
func fleetDecisionHolders(dst []int, i uint64) []int {
	h := decisionKey(i ^ 0x9e37<<48)
	var n int
	switch p := h % 100; {
	case p < 45:
		n = 1
	case p < 75:
		n = 2
	case p < 90:
		n = 3
	case p < 96:
		n = 4
	case p < 99:
		n = 8
	default:
		n = 32
	}
	// An odd stride is a unit mod 1,024: the n holders are distinct.
	first, stride := int(h>>20)%fleetDecisionEndpoints, 1+2*(int(h>>40)%(fleetDecisionEndpoints/2-1))
	for j := 0; j < n; j++ {
		dst = append(dst, (first+j*stride)%fleetDecisionEndpoints)
	}
	return dst
}

// fleetDecisionSetup is the benchmarks' fixture, built once at fleetDecisionEntries.
func fleetDecisionSetup(tb testing.TB) *fleetDecisionFixture {
	fleetDecisionOnce.Do(func() {
		var entries int
		if entries, fleetDecisionErr = fleetDecisionEntries(); fleetDecisionErr == nil {
			fleetDecisionErr = buildFleetDecision(&fleetDecisionFix, entries)
		}
	})
	if fleetDecisionErr != nil {
		tb.Fatal(fleetDecisionErr)
	}
	return &fleetDecisionFix
}

// buildFleetDecision fills f with an inventory of entries (key, endpoint) entries.
func buildFleetDecision(f *fleetDecisionFixture, entries int) error {
	f.entries = entries
	var err error
	if f.chain, err = hashcore.New(fleetDecisionSpec()); err != nil {
		return fmt.Errorf("FLEET_DECISION_ALGO: %w", err)
	}
	if f.inv, err = shard.New(shard.Config{Endpoints: fleetDecisionEndpoints}); err != nil {
		return err
	}
	base := decisionPromptTokens(decisionTokens)
	var keys [][]uint64
	for v := 0; v < fleetDecisionPrompts; v++ {
		p := slices.Clone(base)
		p[0] = uint32(v) // every block key differs: the chain covers token 0
		k := hashcore.Keys(f.chain, nil, p, nil)
		f.inv.Add(5, k[:384])
		f.inv.Add(300, k[:256])
		f.inv.Add(900, k[:128])
		f.prompts, keys = append(f.prompts, p), append(keys, k)
	}
	batches := make([][]uint64, fleetDecisionEndpoints)
	var holders []int
	for n, i := fleetDecisionPrompts*(384+256+128), uint64(0); n < f.entries; i++ {
		holders = fleetDecisionHolders(holders[:0], i)
		for _, ep := range holders {
			if batches[ep] = append(batches[ep], decisionKey(1<<40+i)); len(batches[ep]) == 64 {
				f.inv.Add(ep, batches[ep])
				batches[ep] = batches[ep][:0]
			}
		}
		n += len(holders)
	}
	for ep := range batches {
		f.inv.Add(ep, batches[ep])
	}
	f.elig = shard.NewMask(fleetDecisionEndpoints)
	f.elig.SetAll(fleetDecisionEndpoints)
	loads := balance.NewLoads(fleetDecisionEndpoints)
	q := route.NewQueues(fleetDecisionEndpoints, 0, 0, time.Hour) // reports stay fresh through a run
	now := time.Now()
	for i := 0; i < fleetDecisionEndpoints; i++ {
		q.Sent(i, 100*(i%7))
		for j := 0; j < i%3; j++ {
			loads.Inc(i)
		}
		q.Finished(i, route.Ticket{}, time.Duration(200+i%300)*time.Millisecond, 0, false)
		if i%2 == 0 {
			q.Observe(i, route.Report{Running: int64(i % 12), Waiting: int64(i % 3), KVUsage: 0.5, Slots: 8}, loads.Get(i), now)
		}
	}
	f.cost = &route.Cost{Loads: loads, Queues: q, Popular: route.NewPopularity(16), FairShare: route.DefaultFairShare}
	for _, k := range keys {
		f.cost.Popular.Record(k, now)
	}
	return nil
}

// fleetDecision is one request's buffers.
type fleetDecision struct {
	keys   []uint64
	scores []int32
	cand   route.Candidates
}

func newFleetDecision() *fleetDecision {
	return &fleetDecision{keys: make([]uint64, 0, decisionTokens/16), scores: make([]int32, fleetDecisionEndpoints)}
}

// decide is the decision for prompt v as the proxy's request path makes it: keys, score,
// select.
func (f *fleetDecisionFixture) decide(d *fleetDecision, v int) int {
	tokens := f.prompts[v%len(f.prompts)]
	d.keys = hashcore.Keys(f.chain, d.keys[:0], tokens, nil)
	best, _ := f.inv.Score(d.keys, f.elig, shard.Overlap, d.scores)
	d.cand = route.Candidates{Eligible: f.elig, Matched: d.scores, Best: best, Tokens: len(tokens),
		BlockSize: 16, MinBlocks: 1, Blocks: d.keys}
	return f.cost.Select(&d.cand, nil)
}

// TestDecisionFleet checks the fleet decision and its 0 allocs: the deepest holder, whose
// predicted first token is the soonest by far (2,048 uncached tokens and 500 queued
// against 4,096 and 600 at endpoint 300, all 8,192 anywhere else), wins.
//
// At 1M entries (the benchmark's 10M would take minutes under -race): what it checks
// does not depend on the fill.
func TestDecisionFleet(t *testing.T) {
	var f fleetDecisionFixture
	if err := buildFleetDecision(&f, 1e6); err != nil {
		t.Fatal(err)
	}
	d := newFleetDecision()
	for v := range fleetDecisionPrompts {
		if w := f.decide(d, v); w != 5 || d.scores[5] != 384 || d.scores[300] != 256 || d.scores[900] != 128 {
			t.Fatalf("prompt %d: endpoint %d, scores 5:%d 300:%d 900:%d; want 5 (384, 256, 128)",
				v, w, d.scores[5], d.scores[300], d.scores[900])
		}
	}
	v := 0
	if a := testing.AllocsPerRun(20, func() { f.decide(d, v); v++ }); a != 0 {
		t.Fatalf("%.1f allocs per decision, want 0", a)
	}
}

// BenchmarkDecisionFleetStages splits the fleet decision: the cold hash (as
// BenchmarkDecisionStages/hash), the score of each prompt in turn (cold, as the decision
// meets it) and of one prompt again and again (warm: the probes' cost once their cache
// and TLB misses are gone), and the select.
func BenchmarkDecisionFleetStages(b *testing.B) {
	f := fleetDecisionSetup(b)
	d := newFleetDecision()
	f.decide(d, 0)
	all := make([][]uint64, len(f.prompts))
	for v, p := range f.prompts {
		all[v] = hashcore.Keys(f.chain, nil, p, nil)
	}
	b.Run("hash", func(b *testing.B) {
		b.ReportAllocs()
		clock := testfix.StartCPUClock()
		for b.Loop() {
			d.keys = hashcore.Keys(f.chain, d.keys[:0], f.prompts[0], nil)
		}
		clock.Stop(b, b.N)
	})
	b.Run("score/cold", func(b *testing.B) {
		b.ReportAllocs()
		clock := testfix.StartCPUClock()
		v := 0
		for b.Loop() {
			f.inv.Score(all[v%len(all)], f.elig, shard.Overlap, d.scores)
			v++
		}
		clock.Stop(b, b.N)
	})
	b.Run("score/warm", func(b *testing.B) {
		b.ReportAllocs()
		clock := testfix.StartCPUClock()
		for b.Loop() {
			f.inv.Score(all[0], f.elig, shard.Overlap, d.scores)
		}
		clock.Stop(b, b.N)
	})
	f.decide(d, 0)
	b.Run("select", func(b *testing.B) {
		b.ReportAllocs()
		clock := testfix.StartCPUClock()
		for b.Loop() {
			f.cost.Select(&d.cand, nil)
		}
		clock.Stop(b, b.N)
	})
}
