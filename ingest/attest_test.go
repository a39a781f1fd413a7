package ingest

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/engine"
	"github.com/kvgate/kvgate/hashcore"
)

type attestEvent struct {
	Kind      string   `json:"kind"`
	Hashes    []string `json:"hashes"`
	Parent    *string  `json:"parent"`
	Tokens    []uint32 `json:"tokens"`
	BlockSize int      `json:"block_size"`
	LoRAName  string   `json:"lora_name"`
}

type attestStream struct {
	Name      string        `json:"name"`
	Engine    engine.Kind   `json:"engine"`
	Algo      string        `json:"algo"`
	BlockSize int           `json:"block_size"`
	Seed      string        `json:"seed"`
	Events    []attestEvent `json:"events"`
}

func loadStreams(t testing.TB) map[string]attestStream {
	var ss []attestStream
	loadJSON(t, "attest.json", &ss)
	out := map[string]attestStream{}
	for _, s := range ss {
		out[s.Name] = s
	}
	return out
}

func (s attestStream) pubEvents(t testing.TB) []enginepub.Event {
	var out []enginepub.Event
	for _, ev := range s.Events {
		hs := u64s(t, ev.Hashes)
		switch ev.Kind {
		case "stored":
			e := enginepub.BlockStored{Hashes: hs, TokenIDs: ev.Tokens, BlockSize: ev.BlockSize, LoRAName: ev.LoRAName}
			if ev.Parent != nil {
				e.Parent, e.HasParent = u64s(t, []string{*ev.Parent})[0], true
			}
			out = append(out, e)
		case "removed":
			out = append(out, enginepub.BlockRemoved{Hashes: hs})
		}
	}
	return out
}

// expectedKeys replays streams into the set of keys the inventory must hold: the engine's
// keys, or (fast) kvgate's fast key of each live block, computed the way the request
// path does: over the block's whole token prefix from the root.
func expectedKeys(t testing.TB, fast bool, bs int, streams ...attestStream) []uint64 {
	prefix := map[uint64][]uint32{}
	lora := map[uint64]string{}
	live := map[uint64]bool{}
	for _, s := range streams {
		for _, ev := range s.Events {
			hs := u64s(t, ev.Hashes)
			if ev.Kind == "removed" {
				for _, h := range hs {
					delete(live, h)
				}
				continue
			}
			var base []uint32
			if ev.Parent != nil {
				base = prefix[u64s(t, []string{*ev.Parent})[0]]
			}
			for i, h := range hs {
				prefix[h] = append(slices.Clone(base), ev.Tokens[:(i+1)*ev.BlockSize]...)
				lora[h] = ev.LoRAName
				live[h] = true
			}
		}
	}
	var out []uint64
	f := hashcore.NewFast(bs)
	for h := range live {
		if !fast {
			out = append(out, h)
			continue
		}
		var ex *hashcore.Extras
		if lora[h] != "" {
			ex = &hashcore.Extras{LoRAName: lora[h]}
		}
		k := hashcore.Keys(f, nil, prefix[h], ex)
		out = append(out, k[len(k)-1])
	}
	return sorted(out)
}

func ruleChain(t testing.TB, eng engine.Kind, algo string, bs int) (hashcore.Chain, *hashcore.Spec) {
	spec := &hashcore.Spec{Engine: eng, Algo: algo, BlockSize: bs}
	c, err := hashcore.New(*spec)
	if err != nil {
		t.Fatal(err)
	}
	return c, spec
}

// runStreams publishes streams over ZeroMQ to one endpoint and returns its status.
func runStreams(t *testing.T, cfg Config, layout enginepub.Layout, pin bool, streams ...attestStream) (*Manager, EndpointStatus) {
	t.Helper()
	eng := streams[0].Engine
	addr := freeAddr(t, 1)
	f := enginepub.Format{Layout: layout}
	if eng == "sglang" {
		f.Flavor = enginepub.SGLang
	}
	pub := newPub(t, enginepub.Config{Endpoint: addr, Format: f})
	m := startManager(t, cfg, EndpointConfig{Name: "e", Engine: eng, Events: addr, FixedBlockSize: pin})
	waitSubscribed(t, pub)
	n := 0
	for _, s := range streams {
		for _, ev := range s.pubEvents(t) {
			if err := pub.Publish(ev); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	waitFor(t, "batches", func() bool { return m.Status(0).Batches == uint64(n) })
	return m, m.Status(0)
}

func TestParityAttestation(t *testing.T) {
	ss := loadStreams(t)
	ok, okLoRA, bad, sg := ss["vllm-ok"], ss["vllm-ok-lora"], ss["vllm-seed-mismatch"], ss["sglang-ok"]
	if ok.Name == "" || bad.Name == "" || sg.Name == "" || okLoRA.Name == "" {
		t.Fatal("attest.json lacks a stream")
	}
	type tc struct {
		name    string
		keys    KeyMode
		engine  engine.Kind
		algo    string
		bs      int
		layout  enginepub.Layout
		streams []attestStream
		parity  string
		rehash  bool
		cause   string
		want    []uint64 // nil: computed from streams
		pinned  bool     // the endpoint pins the rule's block size (no adoption)
	}
	cases := []tc{
		{name: "vllm-ok-auto", keys: KeysAuto, engine: "vllm", algo: "sha256_cbor", bs: 16, streams: []attestStream{ok}, parity: "ok"},
		{name: "vllm-ok-map-lora", keys: KeysAuto, engine: "vllm", algo: "sha256_cbor", bs: 16, layout: enginepub.LayoutMap, streams: []attestStream{okLoRA}, parity: "ok"},
		{name: "vllm-ok-map-batch", keys: KeysAuto, engine: "vllm", algo: "sha256_cbor", bs: 16, layout: enginepub.LayoutMapBatch, streams: []attestStream{ok, okLoRA}, parity: "ok"},
		{name: "vllm-ok-rehash", keys: KeysRehash, engine: "vllm", algo: "sha256_cbor", bs: 16, streams: []attestStream{ok}, parity: "ok", rehash: true},
		// Parity held for a while, then a mismatching stream: auto re-keys every block it
		// knows (the ok stream's too) with kvgate's fast chain.
		{name: "vllm-seed-auto", keys: KeysAuto, engine: "vllm", algo: "sha256_cbor", bs: 16, streams: []attestStream{ok, bad}, parity: "mismatch", rehash: true, cause: "seed"},
		{name: "vllm-seed-engine", keys: KeysEngine, engine: "vllm", algo: "sha256_cbor", bs: 16, streams: []attestStream{bad}, parity: "mismatch", cause: "seed"},
		{name: "vllm-algo-auto", keys: KeysAuto, engine: "vllm", algo: "sha256", bs: 16, streams: []attestStream{ok}, parity: "mismatch", rehash: true, cause: "algo: the engine hashes with sha256_cbor"},
		// The rule's blocks are 8 tokens, the engine's 16: no engine key lines up, and the
		// diagnosis names the engine's block size. The engine's 16-token blocks are two
		// of kvgate's 8-token fast blocks: after the switch each is indexed under the
		// fast key of its last 8 tokens, which a prompt's fast chain computes too.
		{name: "vllm-blocksize-pinned", keys: KeysAuto, engine: "vllm", algo: "sha256_cbor", bs: 8, pinned: true, streams: []attestStream{ok}, parity: "mismatch", rehash: true, cause: "block size: the engine hashes 16-token blocks, the rule 8"},
		// 16-token engine blocks under a 32-token rule cannot be keyed at all.
		{name: "vllm-blocksize-smaller-pinned", keys: KeysAuto, engine: "vllm", algo: "sha256_cbor", bs: 32, pinned: true, streams: []attestStream{ok}, parity: "mismatch", rehash: true, cause: "block size: the engine publishes 16-token blocks, the rule hashes 32", want: []uint64{}},
		// Unpinned, the endpoint adopts the 16-token blocks its events prove, from a rule
		// of 8 (the engine hashes whole 16-token blocks) or of 32 (not a multiple): parity
		// holds under the adopted size and the engine's keys are indexed.
		{name: "vllm-blocksize-adopted", keys: KeysAuto, engine: "vllm", algo: "sha256_cbor", bs: 8, streams: []attestStream{ok}, parity: "ok"},
		{name: "vllm-blocksize-smaller-adopted", keys: KeysAuto, engine: "vllm", algo: "sha256_cbor", bs: 32, streams: []attestStream{ok}, parity: "ok"},
		{name: "sglang-ok", keys: KeysAuto, engine: "sglang", algo: "sha256", bs: 4, streams: []attestStream{sg}, parity: "ok"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			inv := newInv(t)
			cfg := testConfig(inv)
			cfg.Keys = c.keys
			cfg.Chain, cfg.Spec = ruleChain(t, c.engine, c.algo, c.bs)
			m, st := runStreams(t, cfg, c.layout, c.pinned, c.streams...)
			if !c.pinned && c.bs != 16 && c.engine == "vllm" && (st.BlockSize != 16 || !st.BlockSizeAdopted) {
				t.Fatalf("block size %d adopted %v, want 16 adopted: %+v", st.BlockSize, st.BlockSizeAdopted, st)
			}
			if st.Parity != c.parity || st.Rehash != c.rehash || m.UsesFastKeys(0) != c.rehash {
				t.Fatalf("parity %s rehash %v, want %s %v: %+v", st.Parity, st.Rehash, c.parity, c.rehash, st)
			}
			if !strings.Contains(st.Cause, c.cause) {
				t.Fatalf("cause %q, want it to name %q", st.Cause, c.cause)
			}
			if c.parity == "ok" && (st.ParityOK == 0 || st.ParityMismatch != 0) {
				t.Fatalf("counts %+v", st)
			}
			if c.parity == "mismatch" && st.ParityMismatch == 0 {
				t.Fatalf("counts %+v", st)
			}
			want := c.want
			if want == nil {
				want = expectedKeys(t, c.rehash, c.bs, c.streams...)
			}
			if got := invKeys(inv, 0); !slices.Equal(got, want) {
				t.Fatalf("inventory\n got %v\nwant %v", got, want)
			}
			if c.rehash && c.keys == KeysAuto && st.ModeSwitches != 1 {
				t.Fatalf("mode switches %d", st.ModeSwitches)
			}
			// KeyGen moved for the endpoint's arrival and once more for a switch to fast
			// keys or an adopted block size, and for nothing else.
			wantGen := uint64(1)
			if c.rehash && c.keys == KeysAuto || st.BlockSizeAdopted {
				wantGen = 2
			}
			if g := m.KeyGen(); g != wantGen {
				t.Fatalf("KeyGen %d, want %d", g, wantGen)
			}
		})
	}
}

// TestAttestationOrphan: a BlockStored whose parent kvgate never saw cannot be attested
// (counted as an orphan and skipped, parity stays unknown).
func TestAttestationOrphan(t *testing.T) {
	ss := loadStreams(t)
	s := ss["vllm-ok"]
	s.Events = s.Events[1:2] // the child event alone
	inv := newInv(t)
	cfg := testConfig(inv)
	cfg.Keys = KeysAuto
	cfg.Chain, cfg.Spec = ruleChain(t, "vllm", "sha256_cbor", 16)
	_, st := runStreams(t, cfg, enginepub.LayoutArray, false, s)
	if st.Parity != "unknown" || st.Orphans != 1 || st.ParitySkipped != 1 || st.Keys != len(s.Events[0].Hashes) {
		t.Fatalf("%+v", st)
	}
}
