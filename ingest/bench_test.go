package ingest

import (
	"context"
	"encoding/hex"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/engine"
	"github.com/kvgate/kvgate/hashcore"
	"github.com/kvgate/kvgate/shard"
)

const (
	benchEvents = 16 // BlockStored events per batch
	benchBlocks = 16 // keys per event
	benchBS     = 16 // tokens per block
	benchRing   = 128
)

// benchPayloads builds a ring of stored batches (16 events x 16 blocks, with token_ids,
// keys computed by the rule's chain so attestation holds) and the matching removals.
func benchPayloads(tb testing.TB, chain hashcore.Chain) (stored, removed [][]byte) {
	f := enginepub.Format{Layout: enginepub.LayoutArray}
	tok := uint32(1)
	for r := 0; r < benchRing; r++ {
		var evs, rms []enginepub.Event
		for e := 0; e < benchEvents; e++ {
			tokens := make([]uint32, benchBlocks*benchBS)
			for i := range tokens {
				tokens[i] = tok % 150000
				tok++
			}
			keys := hashcore.Keys(chain, nil, tokens, nil)
			evs = append(evs, enginepub.BlockStored{Hashes: keys, TokenIDs: tokens, BlockSize: benchBS, Medium: "GPU"})
			rms = append(rms, enginepub.BlockRemoved{Hashes: keys, Medium: "GPU"})
		}
		stored = append(stored, f.AppendBatch(nil, 1, evs))
		removed = append(removed, f.AppendBatch(nil, 1, rms))
	}
	return stored, removed
}

// countingInventory stands in for the index where a measurement is of ingest's own
// work: it only counts. Every store is new to it (AddHeld lists none held), so ranks
// over it keep singles, as over a shard.Inventory.
type countingInventory struct{ added, removed, clears int }

func (c *countingInventory) Add(ep int, keys []uint64) int { c.added += len(keys); return len(keys) }
func (c *countingInventory) AddHeld(ep int, keys, held []uint64) (int, []uint64) {
	return c.Add(ep, keys), held
}
func (c *countingInventory) Keys(ep int, cursor uint64, limit int, dst []uint64) ([]uint64, uint64) {
	return dst, 0
}
func (c *countingInventory) Remove(ep int, keys []uint64) int {
	c.removed += len(keys)
	return len(keys)
}
func (c *countingInventory) ClearEndpoint(ep int) { c.clears++ }
func (c *countingInventory) Count(ep int) int     { return c.added - c.removed }

func benchApplier(tb testing.TB, keys KeyMode, chain hashcore.Chain, inv Inventory) *applier {
	if inv == nil {
		s, err := shard.New(shard.Config{Endpoints: 4})
		if err != nil {
			tb.Fatal(err)
		}
		inv = s
	}
	cfg := Config{Inventory: inv, Keys: keys, Chain: chain, BlockMapSize: 1 << 16}
	m, err := NewManager(cfg, []EndpointConfig{{Name: "b", Engine: "vllm", Events: "tcp://127.0.0.1:1"}})
	if err != nil {
		tb.Fatal(err)
	}
	return newApplier(m.eps[0], m.eps[0].rk[0])
}

func vllmChain(tb testing.TB) hashcore.Chain {
	c, err := hashcore.New(hashcore.Spec{Engine: "vllm", Algo: "sha256_cbor", BlockSize: benchBS})
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// BenchmarkDecodeApply: one op decodes and applies a batch of 16 BlockStored x 16 keys
// (with 256 token_ids each) and a batch removing 16 x 16 keys stored 64 ops before.
// keys/s counts both the stored and the removed keys.
func BenchmarkDecodeApply(b *testing.B) {
	chain := vllmChain(b)
	stored, removed := benchPayloads(b, chain)
	for _, bc := range []struct {
		name  string
		keys  KeyMode
		chain hashcore.Chain
		inv   bool
	}{
		{"engine-keys/no-index", KeysEngine, nil, false},
		{"engine-keys/shard", KeysEngine, nil, true},
		{"engine-keys+attest-sha256_cbor/shard", KeysEngine, chain, true},
		{"rehash-fast/shard", KeysRehash, nil, true},
		{"rehash-fast+attest-sha256_cbor/shard", KeysRehash, chain, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var inv Inventory
			if !bc.inv {
				inv = &countingInventory{}
			}
			a := benchApplier(b, bc.keys, bc.chain, inv)
			for i := 0; i < benchRing; i++ { // warm: the ring's first half is live
				if i < benchRing/2 {
					a.apply(stored[i])
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				j := (i + benchRing/2) % benchRing
				if err := a.apply(stored[j]); err != nil {
					b.Fatal(err)
				}
				if err := a.apply(removed[(j+benchRing/2)%benchRing]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(2*benchEvents*benchBlocks)*float64(b.N)/b.Elapsed().Seconds(), "keys/s")
			if st := a.e.status(); st.ParityMismatch != 0 || st.DecodeErrors != 0 {
				b.Fatalf("%+v", st)
			}
		})
	}
}

// TestDecodeApplyZeroAlloc: decoding and applying a batch allocates nothing per event
// once the buffers are warm, with engine keys, with attestation, and re-hashing. The
// index is a counter here (shard's own growth is shard's to measure); a second check
// with the real shard in steady state (keys already present) shows the whole path.
func TestDecodeApplyZeroAlloc(t *testing.T) {
	chain := vllmChain(t)
	stored, removed := benchPayloads(t, chain)
	for _, bc := range []struct {
		name  string
		keys  KeyMode
		chain hashcore.Chain
	}{
		{"engine", KeysEngine, nil},
		{"engine+attest", KeysEngine, chain},
		{"rehash", KeysRehash, nil},
		{"rehash+attest", KeysRehash, chain},
	} {
		a := benchApplier(t, bc.keys, bc.chain, &countingInventory{})
		if singles := a.r.singlesOn; singles != (bc.keys == KeysEngine) {
			t.Fatalf("%s: singles on %v", bc.name, singles)
		}
		for i := 0; i < 4; i++ {
			a.apply(stored[i])
			a.apply(removed[i])
		}
		i := 0
		allocs := testing.AllocsPerRun(50, func() {
			a.apply(stored[i%4])
			a.apply(removed[i%4])
			i++
		})
		if allocs != 0 {
			t.Errorf("%s: %.1f allocs per 2 batches (%d events), want 0", bc.name, allocs, 2*benchEvents)
		}
		sa := benchApplier(t, bc.keys, bc.chain, nil)
		sa.apply(stored[0])
		if allocs := testing.AllocsPerRun(50, func() { sa.apply(stored[0]) }); allocs != 0 {
			t.Errorf("%s with shard, steady state: %.1f allocs per batch, want 0", bc.name, allocs)
		}
		if st := a.e.status(); st.ParityMismatch != 0 || (bc.chain != nil && st.ParityOK == 0) {
			t.Errorf("%s: %+v", bc.name, st)
		}
	}
}

// BenchmarkZMQLoopback: batches of 16 BlockStored x 16 keys from a Go PUB to the
// manager's SUB over TCP on 127.0.0.1, decoded and applied (engine keys). The PUB is
// zmq4's (a writer goroutine and queue) or internal/zmtp's load-generation one (direct
// writes), which leaves more of the two cores to the subscriber measured.
func BenchmarkZMQLoopback(b *testing.B) {
	for _, lite := range []bool{false, true} {
		name := "zmq4-pub"
		if lite {
			name = "zmtp-pub"
		}
		b.Run(name, func(b *testing.B) { benchZMQLoopback(b, lite) })
	}
}

func benchZMQLoopback(b *testing.B, lite bool) {
	stored, removed := benchPayloads(b, vllmChain(b))
	inv, _ := shard.New(shard.Config{Endpoints: 4})
	addr := freeAddr(b, 1)
	pub := newPub(b, enginepub.Config{Endpoint: addr, Lightweight: lite})
	cfg := testConfig(inv)
	m, err := NewManager(cfg, []EndpointConfig{{Name: "z", Engine: "vllm", Events: addr}})
	if err != nil {
		b.Fatal(err)
	}
	m.Start(context.Background())
	defer m.Close()
	waitSubscribed(b, pub)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p := stored[i%benchRing]
		if i%2 == 1 {
			p = removed[(i-1)%benchRing]
		}
		if err := pub.PublishRaw(p); err != nil {
			b.Fatal(err)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for m.Status(0).Batches < uint64(b.N) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	st := m.Status(0)
	if st.Batches != uint64(b.N) || st.GapsKept+st.GapsCleared != 0 {
		b.Fatalf("received %d of %d batches: %+v", st.Batches, b.N, st)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "batches/s")
	b.ReportMetric(float64(benchEvents*benchBlocks)*float64(b.N)/b.Elapsed().Seconds(), "keys/s")
}

// TestDecodeApplyZeroAllocNewPaths: today's layouts stay allocation-free once warm: a
// vLLM map batch, a batch whose bad events are skipped, SGLang salted and EAGLE bigram
// stores attested and re-hashed, and hybrid-group stores and removals counted per holder.
func TestDecodeApplyZeroAllocNewPaths(t *testing.T) {
	var sg []sglangStream
	loadJSON(t, "sglang_streams.json", &sg)
	var hold []holderStream
	loadJSON(t, "holders.json", &hold)
	hexes := func(ss []string) [][]byte {
		var out [][]byte
		for _, s := range ss {
			b, _ := hex.DecodeString(s)
			out = append(out, b)
		}
		return out
	}
	type run struct {
		name     string
		engine   engine.Kind
		spec     hashcore.Spec
		keys     KeyMode
		payloads [][]byte
	}
	var runs []run
	for _, s := range sg {
		for _, k := range []KeyMode{KeysEngine, KeysRehash} {
			runs = append(runs, run{"sglang-" + s.Name + "/" + k.String(), "sglang",
				hashcore.Spec{Engine: "sglang", BlockSize: s.BlockSize, Bigram: s.Bigram}, k, hexes(s.Payloads)})
		}
	}
	for _, s := range hold {
		if s.Attested > 0 {
			runs = append(runs, run{"vllm-" + s.Name, "vllm",
				hashcore.Spec{Engine: "vllm", Algo: "sha256_cbor", BlockSize: s.BlockSize}, KeysRehash, hexes(s.Payloads)})
		}
	}
	found := 0
	for _, g := range loadBatches(t) {
		if g.Name == "bad-event-mid-batch-vllm" || g.Name == "vllm-map-batch" {
			found++
			runs = append(runs, run{"vllm-" + g.Name, "vllm",
				hashcore.Spec{Engine: "vllm", Algo: "sha256_cbor", BlockSize: 16}, KeysEngine, hexes([]string{g.Payload})})
		}
	}
	if found != 2 || len(runs) < 14 {
		t.Fatalf("golden inputs missing: %d batches, %d runs", found, len(runs))
	}
	for _, r := range runs {
		c, err := hashcore.New(r.spec)
		if err != nil {
			t.Fatal(err)
		}
		cfg := Config{Inventory: &countingInventory{}, Keys: r.keys, Chain: c, Spec: &r.spec, BlockMapSize: 1 << 10}
		m, err := NewManager(cfg, []EndpointConfig{{Name: "z", Engine: r.engine, Events: "tcp://127.0.0.1:1"}})
		if err != nil {
			t.Fatal(err)
		}
		a := newApplier(m.eps[0], m.eps[0].rk[0])
		all := func() {
			for _, p := range r.payloads {
				a.apply(p)
			}
		}
		all()
		all()
		if allocs := testing.AllocsPerRun(50, all); allocs != 0 {
			t.Errorf("%s: %.1f allocs per %d batches, want 0", r.name, allocs, len(r.payloads))
		}
	}
}

// BenchmarkRefTable: one op stores and removes one hash among 16K live ones in the
// default-sized table (the holder counting every stored and removed key pays).
func BenchmarkRefTable(b *testing.B) {
	rt := newRefTable(1 << 17)
	const live = 1 << 14
	keys := make([]uint64, 2*live)
	x := uint64(88172645463325252)
	for i := range keys {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		keys[i] = x
	}
	for _, k := range keys[:live] {
		rt.inc(k, MediumGPU)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		j := i % live
		rt.inc(keys[live+j], MediumGPU)
		rt.dec(keys[j], MediumGPU)
		keys[j], keys[live+j] = keys[live+j], keys[j]
	}
}
