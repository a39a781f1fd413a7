package ingest

import (
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/hashcore"
	"github.com/kvgate/kvgate/shard"
)

// model applies golden expectations (the values the Python encoder was given) to a
// multiset of GPU holders: what the inventory must hold after the same batches. A key
// stays while it has a holder (a store not yet removed); removing a key never stored
// removes it.
type model map[uint64]int

func (m model) apply(t testing.TB, evs []goldenEvent) {
	for _, ev := range evs {
		if ev.Medium != "GPU" && ev.Kind != "cleared" {
			continue
		}
		switch ev.Kind {
		case "stored":
			for _, h := range u64s(t, ev.Hashes) {
				m[h]++
			}
		case "removed":
			for _, h := range u64s(t, ev.Hashes) {
				if m[h]--; m[h] <= 0 {
					delete(m, h)
				}
			}
		case "cleared":
			clear(m)
		}
	}
}

func (m model) keys() []uint64 {
	var k []uint64
	for h := range m {
		k = append(k, h)
	}
	slices.Sort(k)
	return k
}

// TestGoldenBatchesOverZMQ publishes the Python-encoded golden payloads from a Go PUB on
// 127.0.0.1 and checks the inventory against the golden values, per flavour.
func TestGoldenBatchesOverZMQ(t *testing.T) {
	gs := loadBatches(t)
	inv := newInv(t)
	cfg := testConfig(inv)
	eps := []EndpointConfig{
		{Name: "vllm", Index: 0, Engine: "vllm", Topic: "kv-events"},
		{Name: "sglang", Index: 1, Engine: "sglang"},
		{Name: "bad", Index: 2, Engine: "vllm"},
	}
	pubs := make([]*enginepub.Publisher, len(eps))
	for i := range eps {
		eps[i].Events = freeAddr(t, 1)
		pubs[i] = newPub(t, enginepub.Config{Endpoint: eps[i].Events, Topic: eps[i].Topic})
	}
	m := startManager(t, cfg, eps...)
	for _, p := range pubs {
		waitSubscribed(t, p)
	}
	models := []model{{}, {}}
	sent := []int{0, 0, 0}
	bad := 0
	for _, g := range gs {
		p, _ := hex.DecodeString(g.Payload)
		i := 0
		switch {
		case g.Error:
			i = 2
			bad++
		case g.Flavor == "sglang":
			i = 1
		}
		if err := pubs[i].PublishRaw(p); err != nil {
			t.Fatal(err)
		}
		sent[i]++
		if i < 2 {
			models[i].apply(t, g.Events)
		}
	}
	for i := range eps {
		waitFor(t, eps[i].Name+" batches", func() bool { return m.Status(i).Batches == uint64(sent[i]) })
	}
	for i := 0; i < 2; i++ {
		st := m.Status(i)
		if st.DecodeErrors != 0 {
			t.Errorf("%s: %d decode errors on golden batches", eps[i].Name, st.DecodeErrors)
		}
		if got, want := invKeys(inv, i), models[i].keys(); !slices.Equal(got, want) {
			t.Errorf("%s inventory:\n got %v\nwant %v", eps[i].Name, got, want)
		}
		if st.GapsKept+st.GapsCleared+st.Restarts != 0 || st.LastSeq != int64(sent[i]-1) {
			t.Errorf("%s: seq state %+v", eps[i].Name, st)
		}
		if !st.Connected {
			t.Errorf("%s not connected", eps[i].Name)
		}
	}
	unknown := 0
	for _, g := range gs {
		for _, ev := range g.Events {
			if g.Flavor == "vllm" && ev.Kind == "unknown" {
				unknown++
			}
		}
	}
	if st := m.Status(0); unknown == 0 || st.EventsUnknown != uint64(unknown) {
		t.Errorf("vllm unknown events %d, want %d (golden unknown tags)", st.EventsUnknown, unknown)
	}
	if st := m.Status(2); st.DecodeErrors != uint64(bad) {
		t.Errorf("bad payloads: %d decode errors, want %d", st.DecodeErrors, bad)
	}
	// The tier gauges count CPU and STORAGE blocks without routing on them.
	if st := m.Status(0); st.Tiers["CPU"] == 0 || st.Tiers["STORAGE"] == 0 {
		t.Errorf("tiers not tracked: %v", st.Tiers)
	}
}

func stored(keys ...uint64) enginepub.BlockStored {
	return enginepub.BlockStored{Hashes: keys, BlockSize: 16}
}

// TestSeqWindowGapsAndRestart: gap 10 keeps, gap 100 clears, seq back to 0 clears.
func TestSeqWindowGapsAndRestart(t *testing.T) {
	inv := newInv(t)
	addr := freeAddr(t, 1)
	pub := newPub(t, enginepub.Config{Endpoint: addr})
	m := startManager(t, testConfig(inv), EndpointConfig{Name: "e", Engine: "vllm", Events: addr})
	waitSubscribed(t, pub)
	st := func() EndpointStatus { return m.Status(0) }
	pub.Publish(stored(1, 2))
	pub.Publish(stored(3))
	waitFor(t, "2 batches", func() bool { return st().Batches == 2 })

	pub.SetSeq(pub.Seq() + 10) // 10 lost batches: within the window
	pub.Publish(stored(4))
	waitFor(t, "gap 10", func() bool { return st().Batches == 3 })
	if s := st(); s.GapsKept != 1 || s.GapsCleared != 0 || !slices.Equal(invKeys(inv, 0), []uint64{1, 2, 3, 4}) {
		t.Fatalf("after gap 10: %+v keys %v", s, invKeys(inv, 0))
	}

	pub.SetSeq(pub.Seq() + 100) // 100 lost: beyond the window
	pub.Publish(stored(5))
	waitFor(t, "gap 100", func() bool { return st().Batches == 4 })
	if s := st(); s.GapsCleared != 1 || !slices.Equal(invKeys(inv, 0), []uint64{5}) || s.LastSeq != 113 {
		t.Fatalf("after gap 100: %+v keys %v", s, invKeys(inv, 0))
	}

	pub.SetSeq(0) // engine restart
	pub.Publish(stored(6))
	waitFor(t, "restart", func() bool { return st().Batches == 5 })
	if s := st(); s.Restarts != 1 || !slices.Equal(invKeys(inv, 0), []uint64{6}) || s.LastSeq != 0 {
		t.Fatalf("after restart: %+v keys %v", s, invKeys(inv, 0))
	}
	pub.Publish(enginepub.BlockRemoved{Hashes: []uint64{6}}, stored(7), enginepub.AllBlocksCleared{}, stored(8))
	waitFor(t, "events", func() bool { return st().Batches == 6 })
	if s := st(); s.EventsCleared != 1 || !slices.Equal(invKeys(inv, 0), []uint64{8}) {
		t.Fatalf("after clear: %+v keys %v", s, invKeys(inv, 0))
	}
}

// TestReplayBootstrapAndReconnect: batches published before kvgate starts arrive by
// replay (both reply layouts); a near reconnect keeps the inventory and replays the
// missed batches; an engine restart clears it.
func TestReplayBootstrapAndReconnect(t *testing.T) {
	for _, topicFrame := range []bool{false, true} {
		t.Run("topicFrame="+strconv.FormatBool(topicFrame), func(t *testing.T) {
			inv := newInv(t)
			addr, raddr := freeAddr(t, 1), freeAddr(t, 1)
			pcfg := enginepub.Config{Endpoint: addr, Replay: raddr, Topic: "kv", ReplayTopicFrame: topicFrame,
				Format: enginepub.Format{Layout: enginepub.LayoutMap}}
			pub := newPub(t, pcfg)
			for i := uint64(0); i < 20; i++ {
				pub.Publish(stored(100 + i))
			}
			pub.Publish(enginepub.BlockRemoved{Hashes: []uint64{100}})
			m := startManager(t, testConfig(inv), EndpointConfig{Name: "e", Engine: "vllm", Events: addr, Replay: raddr, Topic: "kv"})
			st := func() EndpointStatus { return m.Status(0) }
			waitFor(t, "replay", func() bool { return st().ReplayedBatches == 21 && st().LastSeq == 20 })
			if s := st(); s.Keys != 19 || s.LastSeq != 20 || s.GapsCleared+s.Restarts != 0 {
				t.Fatalf("after replay: %+v", s)
			}
			waitSubscribed(t, pub)
			pub.Publish(stored(200))
			waitFor(t, "live", func() bool { return st().Keys == 20 })

			// Near reconnect: the engine's sockets go away and come back; two batches
			// were published while kvgate was away, and replay brings them back.
			seq := pub.Seq()
			pub.Close()
			waitFor(t, "disconnect", func() bool { return !st().Connected })
			pcfg2 := pcfg
			pcfg2.Seq = seq
			pcfg2.Backlog = [][]enginepub.Event{{stored(201)}, {stored(202)}}
			pub2 := newPub(t, pcfg2)
			// The old listener may accept one last dial while it closes: reconnects >= 1.
			waitFor(t, "reconnect", func() bool { s := st(); return s.Reconnects >= 1 && s.Keys == 22 })
			waitSubscribed(t, pub2)
			pub2.Publish(stored(203))
			waitFor(t, "live after reconnect", func() bool { return st().Keys == 23 && st().LastSeq == int64(seq+2) })
			if s := st(); s.GapsCleared+s.Restarts != 0 || s.LastSeq != int64(seq+2) {
				t.Fatalf("after reconnect: %+v", s)
			}
			// Engine restart: seq back to 0, its replay buffer gone.
			pub2.SetSeq(0)
			pub2.ResetReplay()
			pub2.Publish(stored(300))
			waitFor(t, "restart", func() bool { return st().Restarts == 1 })
			waitFor(t, "restart keys", func() bool { return slices.Equal(invKeys(inv, 0), []uint64{300}) })
		})
	}
}

// TestDataParallelRanks: rank r publishes on base+r into its own inventory slot. A key
// both ranks hold survives its eviction on one of them; one rank's restart (seq back to 0)
// and one rank's AllBlocksCleared clear only that rank.
func TestDataParallelRanks(t *testing.T) {
	inv := newInv(t)
	base := freeAddr(t, 2)
	p0 := newPub(t, enginepub.Config{Endpoint: base, Format: enginepub.Format{DPRank: 0}})
	p1 := newPub(t, enginepub.Config{Endpoint: rankAddr(base, 1), Format: enginepub.Format{DPRank: 1}})
	m := startManager(t, testConfig(inv), EndpointConfig{Name: "dp", Index: 3, Engine: "vllm", Events: base, DP: 2, RankSlots: []int{5}})
	waitSubscribed(t, p0)
	waitSubscribed(t, p1)
	p0.Publish(stored(1, 7))
	p1.Publish(stored(2, 7))
	waitFor(t, "both ranks", func() bool { return m.Status(3).Keys == 4 })
	if s := m.Status(3); !s.Connected || s.Ranks != 2 || s.RanksUp != 2 ||
		!slices.Equal(s.RankSlots, []int{3, 5}) || !slices.Equal(s.RankKeys, []int{2, 2}) {
		t.Fatalf("%+v", s)
	}
	if a, b := invKeys(inv, 3), invKeys(inv, 5); !slices.Equal(a, []uint64{1, 7}) || !slices.Equal(b, []uint64{2, 7}) {
		t.Fatalf("rank slots %v %v", a, b)
	}
	// Rank 0 evicts the shared block: rank 1 still holds it.
	p0.Publish(enginepub.BlockRemoved{Hashes: []uint64{7}})
	waitFor(t, "rank 0 eviction", func() bool { return slices.Equal(invKeys(inv, 3), []uint64{1}) })
	if b := invKeys(inv, 5); !slices.Equal(b, []uint64{2, 7}) {
		t.Fatalf("rank 1 lost keys to rank 0's eviction: %v", b)
	}
	// Rank 1 restarts: only its slot is cleared.
	p1.SetSeq(0)
	p1.ResetReplay()
	p1.Publish(stored(9))
	waitFor(t, "rank 1 restart", func() bool { return m.Status(3).Restarts == 1 && slices.Equal(invKeys(inv, 5), []uint64{9}) })
	if a := invKeys(inv, 3); !slices.Equal(a, []uint64{1}) {
		t.Fatalf("rank 0 lost keys to rank 1's restart: %v", a)
	}
	// Rank 0's engine clears its cache: rank 1 keeps its keys.
	p0.Publish(enginepub.AllBlocksCleared{})
	waitFor(t, "rank 0 cleared", func() bool { return len(invKeys(inv, 3)) == 0 })
	if b := invKeys(inv, 5); !slices.Equal(b, []uint64{9}) {
		t.Fatalf("rank 1 lost keys to rank 0's clear: %v", b)
	}
	// The tier count is recounted from the ranks left (rank 1's one block).
	waitFor(t, "GPU tier recounted", func() bool { return m.Status(3).Tiers["GPU"] == 1 })
	p1.Close()
	waitFor(t, "rank 1 down", func() bool { return m.Status(3).RanksUp == 1 })
	if m.Status(3).Connected {
		t.Fatal("connected with a rank down")
	}
}

// TestDataParallelRankSlotsRefused: dp > 1 without a slot per rank, or two ranks on one
// slot, is refused with a message naming the endpoint.
func TestDataParallelRankSlotsRefused(t *testing.T) {
	inv := newInv(t)
	for _, eps := range [][]EndpointConfig{
		{{Name: "dp", Index: 0, Engine: "vllm", Events: "tcp://127.0.0.1:1", DP: 2}},
		{{Name: "dp", Index: 0, Engine: "vllm", Events: "tcp://127.0.0.1:1", DP: 2, RankSlots: []int{0}}},
		{{Name: "a", Index: 0, Engine: "vllm", Events: "tcp://127.0.0.1:1", DP: 2, RankSlots: []int{1}},
			{Name: "b", Index: 1, Engine: "vllm", Events: "tcp://127.0.0.1:3"}},
	} {
		if _, err := NewManager(testConfig(inv), eps); err == nil || !strings.Contains(err.Error(), "slot") {
			t.Fatalf("%+v: err %v", eps, err)
		}
	}
}

// TestDialRetryAndCloseLeaksNothing: the rule starts before its engine; Close stops every
// goroutine, including zmq4's, whether connected, dialing or never connected.
func TestDialRetryAndCloseLeaksNothing(t *testing.T) {
	base, _ := liveGoroutines()
	inv, _ := shard.New(shard.Config{Endpoints: 4, Shards: 8})
	addr := freeAddr(t, 1)
	dead := freeAddr(t, 1)
	m, err := NewManager(testConfig(inv), []EndpointConfig{
		{Name: "late", Engine: "vllm", Events: addr, Replay: freeAddr(t, 1)},
		{Name: "never", Index: 1, Engine: "sglang", Events: dead},
	})
	if err != nil {
		t.Fatal(err)
	}
	m.Start(t.Context())
	waitFor(t, "dial failures", func() bool { return m.Status(0).DialFailures >= 2 })
	pub, err := enginepub.New(enginepub.Config{Endpoint: addr})
	if err != nil {
		t.Fatal(err)
	}
	waitSubscribed(t, pub)
	pub.Publish(stored(9))
	waitFor(t, "late engine", func() bool { return m.Status(0).Keys == 1 })
	m.Close()
	pub.Close()
	settleGoroutines(t, base)
}

// TestGapFilledFromReplay: batches lost on the wire (kept in the engine's replay buffer)
// are fetched when the next live batch shows the gap: nothing is cleared, even past the
// window.
func TestGapFilledFromReplay(t *testing.T) {
	inv := newInv(t)
	addr, raddr := freeAddr(t, 1), freeAddr(t, 1)
	pub := newPub(t, enginepub.Config{Endpoint: addr, Replay: raddr})
	m := startManager(t, testConfig(inv), EndpointConfig{Name: "e", Engine: "vllm", Events: addr, Replay: raddr})
	st := func() EndpointStatus { return m.Status(0) }
	waitSubscribed(t, pub)
	pub.Publish(stored(1))
	waitFor(t, "first", func() bool { return st().LastSeq == 0 })
	var want []uint64
	want = append(want, 1)
	for i := uint64(0); i < 100; i++ { // 100 lost batches: beyond the window
		pub.Drop(stored(1000 + i))
		want = append(want, 1000+i)
	}
	pub.Drop(enginepub.BlockRemoved{Hashes: []uint64{1000}})
	pub.Publish(stored(2))
	want = append(want[:1], want[2:]...)
	want = append(want, 2)
	waitFor(t, "filled", func() bool { return st().LastSeq == 102 })
	// The subscribe-time replay can race the first publish and fetch seq 0 too; the live
	// copy of it is then a duplicate. Either way the gap itself is 101 replayed batches.
	if s := st(); s.GapsFilled != 1 || s.GapsCleared+s.GapsKept != 0 || s.Duplicates > 1 ||
		s.ReplayedBatches != 101+s.Duplicates {
		t.Fatalf("%+v", s)
	}
	if got := invKeys(inv, 0); !slices.Equal(got, sorted(want)) {
		t.Fatalf("inventory %v, want %v", got, sorted(want))
	}
}

// TestTierSlots: with CPU and storage slots, vLLM's offload events (medium "CPU",
// "STORAGE") index each tier in its own slot, next to the GPU keys; a block evicted from
// the GPU stays in the CPU slot while the CPU holds it, and leaves it with the CPU's
// removal. Over real ZeroMQ, in vLLM's current map layout.
func TestTierSlots(t *testing.T) {
	inv := newInv(t)
	addr := freeAddr(t, 1)
	pub := newPub(t, enginepub.Config{Endpoint: addr, Format: enginepub.Format{Layout: enginepub.LayoutMap}})
	m := startManager(t, testConfig(inv), EndpointConfig{Name: "e", Index: 0, Engine: "vllm", Events: addr,
		CPUSlots: []int{1}, StorageSlots: []int{2}})
	waitSubscribed(t, pub)
	pub.Publish(stored(1, 2, 3))
	pub.Publish(enginepub.BlockStored{Hashes: []uint64{1, 2}, Medium: "CPU"})
	pub.Publish(enginepub.BlockStored{Hashes: []uint64{1}, Medium: "STORAGE"})
	waitFor(t, "tiers", func() bool { return len(invKeys(inv, 2)) == 1 })
	if g, c, s := invKeys(inv, 0), invKeys(inv, 1), invKeys(inv, 2); !slices.Equal(g, []uint64{1, 2, 3}) ||
		!slices.Equal(c, []uint64{1, 2}) || !slices.Equal(s, []uint64{1}) {
		t.Fatalf("gpu %v cpu %v storage %v", g, c, s)
	}
	// The GPU evicts 1 and 2: the CPU still holds them.
	pub.Publish(enginepub.BlockRemoved{Hashes: []uint64{1, 2}})
	waitFor(t, "gpu eviction", func() bool { return slices.Equal(invKeys(inv, 0), []uint64{3}) })
	if c := invKeys(inv, 1); !slices.Equal(c, []uint64{1, 2}) {
		t.Fatalf("cpu slot after the GPU's eviction: %v", c)
	}
	pub.Publish(enginepub.BlockRemoved{Hashes: []uint64{2}, Medium: "CPU"})
	waitFor(t, "cpu eviction", func() bool { return slices.Equal(invKeys(inv, 1), []uint64{1}) })
	if s := invKeys(inv, 2); !slices.Equal(s, []uint64{1}) {
		t.Fatalf("storage slot after the CPU's eviction: %v", s)
	}
	// A cache reset clears every tier of the rank.
	pub.Publish(enginepub.AllBlocksCleared{})
	waitFor(t, "cleared", func() bool { return len(invKeys(inv, 1))+len(invKeys(inv, 2))+len(invKeys(inv, 0)) == 0 })
	if st := m.Status(0); st.EventsStored != 3 {
		t.Fatalf("%+v", st)
	}
}

// TestTierSlotsRehashed: an endpoint on kvgate's fast keys (-kv-keys rehash) indexes an
// offload store that carries no tokens (vLLM's CPU offload) under the fast keys its GPU
// store computed, taken from the block map.
func TestTierSlotsRehashed(t *testing.T) {
	inv := newInv(t)
	addr := freeAddr(t, 1)
	pub := newPub(t, enginepub.Config{Endpoint: addr})
	cfg := testConfig(inv)
	cfg.Keys = KeysRehash
	startManager(t, cfg, EndpointConfig{Name: "e", Index: 0, Engine: "vllm", Events: addr, CPUSlots: []int{1}})
	waitSubscribed(t, pub)
	toks := make([]uint32, 48)
	for i := range toks {
		toks[i] = uint32(1000 + i)
	}
	pub.Publish(enginepub.BlockStored{Hashes: []uint64{11, 12, 13}, TokenIDs: toks, BlockSize: 16})
	pub.Publish(enginepub.BlockStored{Hashes: []uint64{11, 12}, BlockSize: 16, Medium: "CPU"})
	fast := sorted(hashcore.Keys(hashcore.NewFast(16), nil, toks, nil))
	waitFor(t, "cpu slot", func() bool { return len(invKeys(inv, 1)) == 2 })
	want := sorted(hashcore.Keys(hashcore.NewFast(16), nil, toks[:32], nil))
	if g, c := invKeys(inv, 0), invKeys(inv, 1); !slices.Equal(g, fast) || !slices.Equal(c, want) {
		t.Fatalf("gpu %v (want %v) cpu %v (want %v)", g, fast, c, want)
	}
}
