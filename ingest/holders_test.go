package ingest

import (
	"encoding/hex"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/hashcore"

	"github.com/kvgate/kvgate/shard"
)

type holderStream struct {
	Name      string           `json:"name"`
	Routed    []string         `json:"routed"`
	BlockSize int              `json:"block_size"`
	Payloads  []string         `json:"payloads"`
	Keys      []string         `json:"keys"`
	Tiers     map[string]int64 `json:"tiers"`
	Attested  uint64           `json:"attested"`
}

// TestHoldersPerTierAndGroup applies Python-built vLLM batches (map layout) in which a
// hash has several holders: offload chunks announcing it twice on CPU, identical blocks
// vLLM does not de-duplicate, the KV cache groups of a sliding-window and a mamba hybrid
// model (the mamba group with 32-token blocks over a 16-token hash block). A removal
// reaches the inventory only when the last holder on the routed tiers is gone; the tier
// counts are distinct hashes held; every store with tokens attests, the 32-token mamba
// blocks included.
func TestHoldersPerTierAndGroup(t *testing.T) {
	var streams []holderStream
	loadJSON(t, "holders.json", &streams)
	if len(streams) < 10 {
		t.Fatalf("%d streams", len(streams))
	}
	for _, s := range streams {
		t.Run(s.Name, func(t *testing.T) {
			inv := newInv(t)
			logs := &recordingHandler{}
			cfg := testConfig(inv)
			cfg.Logger = slog.New(logs)
			routed, err := parseMedia(strings.Join(s.Routed, ","))
			if err != nil {
				t.Fatal(err)
			}
			cfg.Routed = routed
			if s.Attested > 0 { // the streams with real keys (the others' are arbitrary)
				cfg.Chain, cfg.Spec = ruleChain(t, "vllm", "sha256_cbor", s.BlockSize)
			}
			m, err := NewManager(cfg, []EndpointConfig{{Name: "h", Engine: "vllm", Events: "tcp://127.0.0.1:1"}})
			if err != nil {
				t.Fatal(err)
			}
			a := newApplier(m.eps[0], m.eps[0].rk[0])
			for _, p := range s.Payloads {
				b, _ := hex.DecodeString(p)
				if err := a.apply(b); err != nil {
					t.Fatal(err)
				}
			}
			if got, want := invKeys(inv, 0), sorted(u64s(t, s.Keys)); !slices.Equal(got, want) {
				t.Fatalf("inventory\n got %v\nwant %v", got, want)
			}
			st := m.Status(0)
			for _, tier := range []string{"GPU", "CPU", "STORAGE", "EXTERNAL", "OTHER"} {
				if st.Tiers[tier] != s.Tiers[tier] {
					t.Fatalf("tiers %v, want %v", st.Tiers, s.Tiers)
				}
			}
			if st.ParityOK != s.Attested || st.ParityMismatch != 0 || st.BlockSizeMismatch {
				t.Fatalf("attestation: %+v", st)
			}
			if w := logs.matching("WARN"); len(w) != 0 {
				t.Fatalf("WARNs on a healthy stream: %q", w)
			}
		})
	}
}

// TestRefTableBounded: a table of one set forgets the oldest hashes when full (counted);
// a forgotten hash's removal is applied as one holder's; the steady state allocates
// nothing.
func TestRefTableBounded(t *testing.T) {
	rt := newRefTable(1)
	if rt.cap != refSlots {
		t.Fatalf("cap %d", rt.cap)
	}
	var dropped int
	for k := uint64(1); k <= 3*refSlots; k++ {
		if _, d := rt.inc(k, MediumGPU); d != 0 {
			dropped++
		}
	}
	if dropped != 2*refSlots || rt.evicted != uint64(2*refSlots) {
		t.Fatalf("dropped %d evicted %d", dropped, rt.evicted)
	}
	if known, gone, left := rt.dec(1, MediumGPU); known || !gone || left != 0 {
		t.Fatalf("forgotten hash: known %v gone %v left %v", known, gone, left)
	}
	k := uint64(3 * refSlots)
	rt.inc(k, MediumGPU)
	rt.inc(k, MediumCPU)
	if known, gone, left := rt.dec(k, MediumGPU); !known || gone || left != 1<<MediumGPU|1<<MediumCPU {
		t.Fatalf("two GPU holders: %v %v %v", known, gone, left)
	}
	if _, gone, left := rt.dec(k, MediumGPU); !gone || left != 1<<MediumCPU {
		t.Fatalf("last GPU holder: %v %v", gone, left)
	}
	if known, gone, left := rt.dec(k, MediumStorage); !known || gone || left != 1<<MediumCPU {
		t.Fatalf("a removal on a tier without holders: %v %v %v", known, gone, left)
	}
	if allocs := testing.AllocsPerRun(100, func() {
		rt.inc(7, MediumGPU)
		rt.dec(7, MediumGPU)
	}); allocs != 0 {
		t.Fatalf("%.1f allocs", allocs)
	}
}

// TestRefTableGrows: a table starts at refMinSets and doubles as stores fill its sets,
// forgetting nothing below its capacity; every hash keeps its holder counts through the
// growth; a reset gives the memory back; past capacity it evicts as a fixed table does.
func TestRefTableGrows(t *testing.T) {
	rt := newRefTable(1 << 14)
	if rt.cap != 1<<14/refWays*refSlots { // a header per set
		t.Fatalf("cap %d", rt.cap)
	}
	const n = 3000 // a few growths, well under capacity
	for k := uint64(1); k <= n; k++ {
		rt.inc(k*0x9e3779b97f4a7c15, MediumGPU)
		if k%3 == 0 {
			rt.inc(k*0x9e3779b97f4a7c15, MediumGPU) // a second holder
		}
	}
	if rt.evicted != 0 {
		t.Fatalf("%d evicted below capacity", rt.evicted)
	}
	if rt.slots() >= rt.cap || rt.slots() < n {
		t.Fatalf("%d slots allocated for %d hashes (capacity %d)", rt.slots(), n, rt.cap)
	}
	for k := uint64(1); k <= n; k++ {
		h := k * 0x9e3779b97f4a7c15
		known, gone, _ := rt.dec(h, MediumGPU)
		if !known || gone != (k%3 != 0) {
			t.Fatalf("hash %d after growth: known %v gone %v", k, known, gone)
		}
	}
	rt.reset()
	if rt.ents != nil || rt.sets != refMinSets {
		t.Fatalf("reset kept %d entries, %d sets", len(rt.ents), rt.sets)
	}
	for k := uint64(1); k <= 2*(1<<14); k++ {
		rt.inc(k*0x9e3779b97f4a7c15, MediumGPU)
	}
	if rt.slots() != rt.cap || rt.evicted == 0 {
		t.Fatalf("past capacity: %d slots, %d evicted", rt.slots(), rt.evicted)
	}
}

// trtStored32 is a TensorRT-LLM drain answer storing one 32-token block (hash 5).
var trtStored32 = `[{"event_id":0,"data":{"type":"stored","parent_hash":null,"blocks":[` +
	`{"type":"stored_block","block_hash":5,"tokens":[` + strings.Repeat(`{"type":"unique_token","token_id":1,"token_extra_id":0},`, 31) +
	`{"type":"unique_token","token_id":1,"token_extra_id":0}],"cache_level":0,"priority":35}]},"window_size":4096}]`

// blockSizeRule is a 12-token vLLM sha256_cbor rule over a vLLM endpoint (slot 0), fed
// its 16-token vllm-ok stream, and a TensorRT-LLM endpoint (slot 1), both with their
// block sizes pinned (fixed) or left to adopt.
func blockSizeRule(t *testing.T, fixed bool) (*Manager, *shard.Inventory, *recordingHandler) {
	t.Helper()
	ss := loadStreams(t)
	inv := newInv(t)
	logs := &recordingHandler{}
	cfg := testConfig(inv)
	cfg.Logger = slog.New(logs)
	cfg.Keys = KeysAuto
	cfg.Chain, cfg.Spec = ruleChain(t, "vllm", "sha256_cbor", 12)
	m, err := NewManager(cfg, []EndpointConfig{
		{Name: "v12", Index: 0, Engine: "vllm", Events: "tcp://127.0.0.1:1", FixedBlockSize: fixed},
		{Name: "trt", Index: 1, Engine: "trtllm", URL: "http://127.0.0.1:1", FixedBlockSize: fixed},
	})
	if err != nil {
		t.Fatal(err)
	}
	a := newApplier(m.eps[0], m.eps[0].rk[0])
	for _, ev := range ss["vllm-ok"].pubEvents(t) {
		a.apply(fmtBatch(ev))
	}
	return m, inv, logs
}

// TestBlockSizeFindingWARNs: a vLLM endpoint whose blocks are not a multiple of the
// rule's, and a TensorRT-LLM endpoint whose blocks are not the fast chain's, each WARN
// once naming the endpoint and the block size the events prove, and show it in the
// status (TensorRT-LLM used to index nothing silently).
func TestBlockSizeFindingWARNs(t *testing.T) {
	m, _, logs := blockSizeRule(t, true)
	st := m.Status(0)
	if st.EngineBlockSize != 16 || !st.BlockSizeMismatch || !strings.Contains(st.Cause, "16-token blocks, the rule hashes 12") {
		t.Fatalf("vllm status %+v", st)
	}
	w := logs.matching("do not fit the rule's block size")
	if len(w) != 1 || !strings.Contains(w[0], "endpoint=v12") || !strings.Contains(w[0], "engine_block_size=16") || !strings.Contains(w[0], "rule_block_size=12") {
		t.Fatalf("WARNs %q", w)
	}
	trt, err := parseTRTEvents([]byte(trtStored32))
	if err != nil {
		t.Fatal(err)
	}
	ta := newTRTApplier(m.eps[1])
	ta.apply(trt)
	ta.apply(trt)
	if st := m.Status(1); st.EngineBlockSize != 32 || !st.BlockSizeMismatch || st.Unkeyable != 2 {
		t.Fatalf("trt status %+v", st)
	}
	if w := logs.matching("endpoint=trt"); len(w) != 1 || !strings.Contains(w[0], "engine_block_size=32") {
		t.Fatalf("trt WARNs %q", w)
	}
}

// TestBlockSizeAdopted: the same endpoints unpinned adopt the block size their events
// prove (a WARN each, Status.BlockSize, BlockSizeAdopted): the vLLM endpoint attests its
// 16-token blocks under a 12-token rule, and the TensorRT-LLM endpoint keys its 32-token
// blocks with a 32-token fast chain instead of none.
func TestBlockSizeAdopted(t *testing.T) {
	m, inv, logs := blockSizeRule(t, false)
	st := m.Status(0)
	if st.BlockSize != 16 || !st.BlockSizeAdopted || st.BlockSizeMismatch || st.Parity != "ok" || st.Rehash || st.Keys == 0 {
		t.Fatalf("vllm status %+v", st)
	}
	if c, f := m.Contract(0); c == nil || c.BlockSize() != 16 || f.BlockSize() != 16 || c == m.cfg.Chain {
		t.Fatalf("contract %v %v", c, f)
	}
	if w := logs.matching("adopted the engine's block size"); len(w) != 1 || !strings.Contains(w[0], "endpoint=v12") ||
		!strings.Contains(w[0], "engine_block_size=16") || !strings.Contains(w[0], "rule_block_size=12") {
		t.Fatalf("WARNs %q", w)
	}
	trt, err := parseTRTEvents([]byte(trtStored32))
	if err != nil {
		t.Fatal(err)
	}
	newTRTApplier(m.eps[1]).apply(trt)
	if st := m.Status(1); st.BlockSize != 32 || !st.BlockSizeAdopted || st.BlockSizeMismatch || st.Unkeyable != 0 || st.Keys != 1 {
		t.Fatalf("trt status %+v", st)
	}
	_, f := m.Contract(1)
	want := hashcore.Keys(f, nil, slices.Repeat([]uint32{1}, 32), nil)
	if got := invKeys(inv, 1); !slices.Equal(got, want) {
		t.Fatalf("trt keys %v, want the 32-token fast key %v", got, want)
	}
}

// fmtBatch is one event in an array batch, as enginepub writes it.
func fmtBatch(ev enginepub.Event) []byte {
	f := enginepub.Format{}
	return f.AppendBatch(nil, 1, []enginepub.Event{ev})
}

// TestTopicWithSGLangEpoch: SGLang publishers with a snapshot endpoint send their topic
// followed by NUL-separated metadata; an endpoint configured with the topic still takes
// those batches, and a different topic sharing its prefix is still skipped.
func TestTopicWithSGLangEpoch(t *testing.T) {
	for _, c := range []struct {
		frame string
		ok    bool
	}{{"kv", true}, {"kv\x00sgl-kv-epoch=4f2a", true}, {"kv\x00sgl-kv-epoch=4f2a\x00sgl-kv-snapshot=9", true},
		{"kv2", false}, {"k", false}, {"", false}, {"other\x00kv", false}} {
		if got := topicMatches([]byte(c.frame), "kv"); got != c.ok {
			t.Errorf("topicMatches(%q, kv) = %v", c.frame, got)
		}
	}
	inv := newInv(t)
	addr := freeAddr(t, 1)
	pub := newPub(t, enginepub.Config{Endpoint: addr, Topic: "kv\x00sgl-kv-epoch=4f2a",
		Format: enginepub.Format{Flavor: enginepub.SGLang}})
	m := startManager(t, testConfig(inv), EndpointConfig{Name: "s", Engine: "sglang", Events: addr, Topic: "kv"})
	waitSubscribed(t, pub)
	if err := pub.Publish(enginepub.BlockStored{Hashes: []uint64{42}, BlockSize: 4, Medium: "GPU"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "batch", func() bool { return m.Status(0).Batches == 1 })
	if st := m.Status(0); st.TopicSkipped != 0 || !slices.Equal(invKeys(inv, 0), []uint64{42}) {
		t.Fatalf("%+v", st)
	}
}

// TestSwitchSkipsBlocksOffRoutedTiers: a block evicted from the GPU but still held on the
// CPU stays in the block map (a later chain may name it as parent) and leaves the
// inventory; when a parity failure switches the endpoint to re-hashed keys, only blocks
// still on the GPU are indexed again.
func TestSwitchSkipsBlocksOffRoutedTiers(t *testing.T) {
	m, inv, a, root := autoKeysEndpoint(t)
	a.apply(fmtBatch(root))
	offloaded := root.Hashes[2]
	a.apply(fmtBatch(enginepub.BlockStored{Hashes: []uint64{offloaded}, Medium: "CPU"}))
	a.apply(fmtBatch(enginepub.BlockRemoved{Hashes: []uint64{offloaded}}))
	if got := invKeys(inv, 0); !slices.Equal(got, sorted(root.Hashes[:2])) {
		t.Fatalf("after the GPU eviction: %v", got)
	}
	// A root store whose keys the rule does not reproduce: parity fails, the endpoint
	// switches to fast keys.
	other := enginepub.BlockStored{Hashes: []uint64{1, 2}, TokenIDs: testTokensN(32, 7), BlockSize: 16}
	a.apply(fmtBatch(other))
	st := m.Status(0)
	if !st.Rehash || st.Tiers["CPU"] != 1 {
		t.Fatalf("%+v", st)
	}
	f := hashcore.NewFast(16)
	want := hashcore.Keys(f, nil, root.TokenIDs[:32], nil)
	want = append(want, hashcore.Keys(f, nil, other.TokenIDs, nil)...)
	if len(sorted(want)) != 4 {
		t.Fatal("test tokens collide")
	}
	if got := invKeys(inv, 0); !slices.Equal(got, sorted(want)) {
		t.Fatalf("after the switch\n got %v\nwant %v (the CPU-only block must stay out)", got, sorted(want))
	}
}

// autoKeysEndpoint is one vLLM endpoint under a 16-token sha256_cbor rule in auto key
// mode (a parity failure switches it to fast keys), its applier, and the vllm-ok
// stream's first store: three blocks from the root, with their tokens.
func autoKeysEndpoint(t *testing.T) (*Manager, *shard.Inventory, *applier, enginepub.BlockStored) {
	t.Helper()
	ok := loadStreams(t)["vllm-ok"]
	inv := newInv(t)
	cfg := testConfig(inv)
	cfg.Keys = KeysAuto
	cfg.Chain, cfg.Spec = ruleChain(t, "vllm", "sha256_cbor", 16)
	m, err := NewManager(cfg, []EndpointConfig{{Name: "v", Engine: "vllm", Events: "tcp://127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	return m, inv, newApplier(m.eps[0], m.eps[0].rk[0]), ok.pubEvents(t)[0].(enginepub.BlockStored)
}

func testTokensN(n int, seed uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		seed = seed*1664525 + 1013904223
		out[i] = seed % 150000
	}
	return out
}
