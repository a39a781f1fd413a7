package shard

import (
	"fmt"
	"testing"
)

// TestChurnRecyclesTombstones: at a steady inventory where every add is matched by a
// remove (an engine whose cache is full), recycled and trimmed tombstones keep rebuilds
// rare. Without them every live key is re-inserted 3.5 times per key added for 16-byte
// slots (rebuild load 0.68, next rebuild at 0.875) and about once for 1-byte masks.
// The tables in use stay within the 24 B/key target throughout.
func TestChurnRecyclesTombstones(t *testing.T) {
	for _, tc := range []struct {
		endpoints          int
		maxReinsertsPerAdd float64
	}{
		{8, 0.5},
		{64, 2.0},
		{130, 2.0},
	} {
		t.Run(fmt.Sprintf("endpoints=%d", tc.endpoints), func(t *testing.T) {
			const live, batch, rounds = 1 << 16, 16, 40000
			inv, err := New(Config{Endpoints: tc.endpoints, Shards: 4})
			if err != nil {
				t.Fatal(err)
			}
			keys := make([]uint64, batch)
			fill := func(start uint64) []uint64 {
				for i := range keys {
					keys[i] = benchKey(start + uint64(i))
				}
				return keys
			}
			for i := uint64(0); i < live; i += batch {
				inv.Add(int(i/batch)%tc.endpoints, fill(i))
			}
			before := inv.Stats()
			maxBytes := int64(0)
			oldest, next := uint64(0), uint64(live)
			for r := 0; r < rounds; r++ {
				if got := inv.Add(int(next/batch)%tc.endpoints, fill(next)); got != batch {
					t.Fatalf("round %d: added %d of %d new keys", r, got, batch)
				}
				next += batch
				if got := inv.Remove(int(oldest/batch)%tc.endpoints, fill(oldest)); got != batch {
					t.Fatalf("round %d: removed %d of %d held keys", r, got, batch)
				}
				oldest += batch
				if r%1000 == 0 {
					// The tables in use: a compaction in flight also holds its
					// shard's next table for the milliseconds of its copy.
					inv.waitCompactions()
					maxBytes = max(maxBytes, inv.MemoryBytes())
				}
			}
			after := inv.Stats()
			if after.Keys != live {
				t.Fatalf("Len = %d, want %d", after.Keys, live)
			}
			// A rebuild re-inserts about live/shards keys.
			reinserts := float64(after.Rebuilds-before.Rebuilds) * live / 4
			perAdd := reinserts / float64(rounds*batch)
			t.Logf("rebuilds %d, ~%.2f re-inserts per added key, tombstones %d, max %.1f B/key",
				after.Rebuilds-before.Rebuilds, perAdd, after.Tombstones, float64(maxBytes)/live)
			if perAdd > tc.maxReinsertsPerAdd {
				t.Errorf("%.2f re-inserts per added key, want <= %.2f", perAdd, tc.maxReinsertsPerAdd)
			}
			if tc.endpoints <= 64 && maxBytes > 24*live {
				t.Errorf("memory reached %.1f B/key, target 24", float64(maxBytes)/live)
			}
		})
	}
}
