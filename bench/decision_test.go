package bench

import (
	"sync"
	"testing"

	"github.com/kvgate/kvgate/hashcore"
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
	f := decisionSetup(b)
	b.Run("tokens=8192/endpoints=8", func(b *testing.B) {
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
