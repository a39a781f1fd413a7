package proxy

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/shard"
)

func heldKeys(inv *shard.Inventory, ep int) []uint64 {
	var out []uint64
	for cur := uint64(0); ; {
		var next uint64
		out, next = inv.Keys(ep, cur, 0, out)
		if next == 0 {
			break
		}
		cur = next
	}
	slices.Sort(out)
	return out
}

// prefixTrie.add skips the leading run of keys the current generation already holds for
// the endpoint; the inventory must come out exactly as adding every key would leave it,
// over multi-turn conversations (each turn re-sends the last) and holes (keys removed from
// the middle of a recorded run). Under the per-endpoint bound the same number of keys is
// held: which older key a new one evicts there depends on where shard.Add's 16-key chunks
// fall (it applies a chunk shard by shard), and skipping moves them.
func TestTrieAddSkipsHeldRunExactly(t *testing.T) {
	const eps = 4
	for _, maxKeys := range []int{1 << 16, 300} {
		skip, err := newPrefixTrie(eps, maxKeys, 0)
		if err != nil {
			t.Fatal(err)
		}
		plain, _ := shard.New(shard.Config{Endpoints: eps, MaxKeysPerEndpoint: maxKeys})
		mask, scores := shard.NewMask(eps), make([]int32, eps)
		rng := rand.New(rand.NewPCG(uint64(maxKeys), 3))
		convs := make([][]uint64, 12)
		for i := 0; i < 3000; i++ {
			c := rng.IntN(len(convs))
			for range 1 + rng.IntN(20) { // the next turn: new blocks after the conversation so far
				convs[c] = append(convs[c], rng.Uint64()|1)
			}
			keys := convs[c]
			ep := c % eps
			if rng.IntN(4) == 0 {
				ep = rng.IntN(eps)
			}
			from := rng.IntN(len(keys))             // where the engine's reported blocks end
			if rng.IntN(10) == 0 && len(keys) > 2 { // a hole in what was recorded
				j := rng.IntN(len(keys))
				k := keys[j : j+1]
				skip.cur.Load().Remove(ep, k)
				plain.Remove(ep, k)
			}
			skip.add(ep, keys[from:], mask, scores)
			plain.Add(ep, keys[from:])
		}
		for ep := range eps {
			got, want := heldKeys(skip.cur.Load(), ep), heldKeys(plain, ep)
			if maxKeys < 1<<16 { // bounded: evictions happened (the count is at the bound)
				if len(got) != len(want) || len(want) != maxKeys {
					t.Fatalf("bound %d, endpoint %d: %d keys held after skipping, %d after adding all", maxKeys, ep, len(got), len(want))
				}
				continue
			}
			if !slices.Equal(got, want) {
				t.Fatalf("bound %d, endpoint %d: %d keys held after skipping, %d after adding all", maxKeys, ep, len(got), len(want))
			}
		}
	}
}
