package shard

import (
	"encoding/binary"
	"slices"
	"testing"
)

// FuzzOps drives an inventory and the model with an op sequence decoded from the input:
// each op is 3 bytes (op, endpoint, key seed), keys drawn from a small space so ops
// collide; the input's length picks the rule's width (so its bucket layout) and shard
// count. Run: go test ./shard -run '^$' -fuzz FuzzOps -fuzztime 20s
func FuzzOps(f *testing.F) {
	f.Add([]byte{0, 1, 2, 0, 1, 3, 1, 1, 2, 2, 1, 0, 0, 0, 0})
	f.Add([]byte{0, 70, 0, 0, 70, 255, 4, 70, 0, 1, 70, 255, 3, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 3*2000 {
			return
		}
		// Every bucket layout: 1-, 2-, 4-, 8-byte in-bucket masks, and sparse sets (a
		// two-word rule and the widest one).
		endpoints := [...]int{5, 12, 20, 64, 80, 1024}[len(data)/3%6]
		shards := 1 << (len(data) % 4)
		inv, err := New(Config{Endpoints: endpoints, Shards: shards})
		if err != nil {
			t.Fatal(err)
		}
		m := newModel(endpoints)
		key := func(seed byte) uint64 {
			if seed < 16 {
				return uint64(seed) // includes key 0
			}
			return binary.LittleEndian.Uint64([]byte{seed, seed ^ 0x5a, 0, 0, 0, 0, 0, seed}) * 0x9e3779b97f4a7c15
		}
		for i := 0; i+3 <= len(data); i += 3 {
			op, ep, k := data[i]%8, int(data[i+1])%endpoints, []uint64{key(data[i+2]), key(data[i+2] + 1)}
			switch op {
			case 0, 1, 2, 3:
				if got, want := inv.Add(ep, k), m.add(ep, k); got != want {
					t.Fatalf("Add = %d, model %d", got, want)
				}
			case 4, 5:
				if got, want := inv.Remove(ep, k), m.remove(ep, k); got != want {
					t.Fatalf("Remove = %d, model %d", got, want)
				}
			case 6:
				inv.ClearEndpoint(ep)
				m.clearEndpoint(ep)
			case 7:
				if data[i+2] == 0 {
					inv.ClearAll()
					m.clearAll()
				}
			}
		}
		if inv.Len() != m.len() {
			t.Fatalf("Len = %d, model %d", inv.Len(), m.len())
		}
		chain := make([]uint64, 0, 64)
		for s := 0; s < 64; s++ {
			chain = append(chain, key(byte(s)))
		}
		all := NewMask(endpoints)
		all.SetAll(endpoints)
		scores := make([]int32, endpoints)
		for _, mode := range []Mode{Overlap, Prefix} {
			best, second := inv.Score(chain, all, mode, scores)
			want, wb, ws := m.score(chain, all, mode, endpoints)
			if !slices.Equal(scores, want) || best != wb || second != ws {
				t.Fatalf("%v: %v %d %d, model %v %d %d", mode, scores, best, second, want, wb, ws)
			}
		}
		for ep := 0; ep < endpoints; ep++ {
			if inv.Count(ep) != len(m.eps[ep]) {
				t.Fatalf("endpoint %d: Count %d, model %d", ep, inv.Count(ep), len(m.eps[ep]))
			}
			// Listing scans every slot: for the widest rule, list the endpoints the ops
			// touched (ops name at most 256) and the last one.
			if (ep < 256 || ep == endpoints-1) && !slices.Equal(listAll(t, inv, ep, 7), m.sortedKeys(ep)) {
				t.Fatalf("endpoint %d: listing differs from the model's %d keys", ep, len(m.eps[ep]))
			}
		}
	})
}
