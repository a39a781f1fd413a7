package ingest

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/bench/enginepub"
)

// TestFaultEventFlood: an engine publishing as fast as it can. Whatever the transport
// does at its high-water mark (block, or drop and leave a gap), every batch ends up in
// the inventory: delivered live or fetched from the replay buffer. Nothing is cleared.
func TestFaultEventFlood(t *testing.T) {
	const batches = 20000
	inv := newInv(t)
	addr, raddr := freeAddr(t, 1), freeAddr(t, 1)
	pub := newPub(t, enginepub.Config{Endpoint: addr, Replay: raddr, ReplayBuffer: batches + 1})
	m := startManager(t, testConfig(inv), EndpointConfig{Name: "e", Engine: "vllm", Events: addr, Replay: raddr})
	waitSubscribed(t, pub)
	want := make([]uint64, 0, 2*batches)
	for i := uint64(0); i < batches; i++ {
		k := []uint64{1 + 2*i, 2 + 2*i}
		want = append(want, k...)
		if err := pub.Publish(stored(k...)); err != nil {
			t.Fatal(err)
		}
	}
	st := func() EndpointStatus { return m.Status(0) }
	waitFor(t, "flood applied", func() bool { return st().LastSeq == batches-1 })
	s := st()
	if s.GapsCleared+s.Restarts != 0 {
		t.Fatalf("flood cleared the inventory: %+v", s)
	}
	if got := invKeys(inv, 0); !slices.Equal(got, want) {
		t.Fatalf("inventory has %d keys, want %d", len(got), len(want))
	}
	t.Logf("flood of %d batches: %d live, %d replayed, gaps filled %d, kept %d", batches, s.Batches-s.ReplayedBatches, s.ReplayedBatches, s.GapsFilled, s.GapsKept)
}

// TestFaultDroppedBursts: batches lost in random bursts (a PUB past its high-water mark
// drops whole messages). Without a replay socket, bursts of at most 64 keep the
// inventory (gap counted) and longer ones clear it; with one, every lost batch is
// fetched and nothing is cleared. The inventory equals a model of those rules.
func TestFaultDroppedBursts(t *testing.T) {
	for _, withReplay := range []bool{false, true} {
		name := "no replay"
		if withReplay {
			name = "replay"
		}
		t.Run(name, func(t *testing.T) {
			inv := newInv(t)
			addr := freeAddr(t, 1)
			pcfg := enginepub.Config{Endpoint: addr}
			ecfg := EndpointConfig{Name: "e", Engine: "vllm", Events: addr}
			if withReplay {
				pcfg.Replay = freeAddr(t, 1)
				ecfg.Replay = pcfg.Replay
			}
			pub := newPub(t, pcfg)
			m := startManager(t, testConfig(inv), ecfg)
			waitSubscribed(t, pub)
			rng := rand.New(rand.NewPCG(8, 8))
			var model []uint64
			var wantKept, wantCleared uint64
			key := uint64(1)
			pub.Publish(stored(key))
			model = append(model, key)
			// The first batch applied means the subscriber's bootstrap replay is over: a
			// burst dropped while it ran would be fetched by it, not counted as a gap.
			waitFor(t, "first batch", func() bool { return m.Status(0).LastSeq == 0 })
			for round := 0; round < 40; round++ {
				burst := 1 + rng.IntN(120)
				for i := 0; i < burst; i++ {
					key++
					pub.Drop(stored(key))
					if withReplay {
						model = append(model, key)
					}
				}
				key++
				pub.Publish(stored(key))
				switch {
				case withReplay:
				case burst <= 64:
					wantKept++
				default:
					wantCleared++
					model = model[:0]
				}
				model = append(model, key)
			}
			last := int64(pub.Seq() - 1)
			waitFor(t, "bursts applied", func() bool { return m.Status(0).LastSeq == last })
			s := m.Status(0)
			if withReplay && (s.GapsFilled != 40 || s.GapsKept+s.GapsCleared != 0) {
				t.Errorf("replay: %+v", s)
			}
			if !withReplay && (s.GapsKept != wantKept || s.GapsCleared != wantCleared) {
				t.Errorf("gaps kept %d cleared %d, want %d and %d", s.GapsKept, s.GapsCleared, wantKept, wantCleared)
			}
			if got := invKeys(inv, 0); !slices.Equal(got, sorted(model)) {
				t.Errorf("inventory %d keys, model %d", len(got), len(model))
			}
		})
	}
}

// TestFaultReconnectStorm: the engine's sockets go away and come back 15 times in a row,
// publishing while kvgate is away. Each near reconnect keeps the inventory and replays
// the missed batches; nothing is cleared, every key is there, and the subscriber's
// goroutines do not pile up.
func TestFaultReconnectStorm(t *testing.T) {
	base, _ := liveGoroutines()
	inv := newInv(t)
	addr, raddr := freeAddr(t, 1), freeAddr(t, 1)
	pcfg := enginepub.Config{Endpoint: addr, Replay: raddr}
	pub, err := enginepub.New(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewManager(testConfig(inv), []EndpointConfig{{Name: "e", Engine: "vllm", Events: addr, Replay: raddr}})
	if err != nil {
		t.Fatal(err)
	}
	m.Start(t.Context())
	st := func() EndpointStatus { return m.Status(0) }
	waitSubscribed(t, pub)
	var want []uint64
	key := uint64(0)
	publish := func(p *enginepub.Publisher) {
		key++
		want = append(want, key)
		p.Publish(stored(key))
	}
	publish(pub)
	waitFor(t, "first", func() bool { return st().Keys == 1 })
	const storms = 15
	for i := 0; i < storms; i++ {
		seq := pub.Seq()
		pub.Close()
		waitFor(t, "disconnect", func() bool { return !st().Connected })
		// Two batches published while nobody listened: only replay has them.
		key += 2
		want = append(want, key-1, key)
		cfg := pcfg
		cfg.Seq = seq
		cfg.Backlog = [][]enginepub.Event{{stored(key - 1)}, {stored(key)}}
		for try := 0; ; try++ {
			if pub, err = enginepub.New(cfg); err == nil {
				break
			}
			if try > 50 {
				t.Fatal(err)
			}
			waitFor(t, "port free", func() bool { return true })
		}
		waitSubscribed(t, pub)
		publish(pub)
		n := len(want)
		waitFor(t, "caught up", func() bool { return st().Keys == n })
	}
	s := st()
	if s.GapsCleared+s.Restarts != 0 || s.Reconnects < storms {
		t.Errorf("after %d reconnects: %+v", storms, s)
	}
	if got := invKeys(inv, 0); !slices.Equal(got, sorted(want)) {
		t.Errorf("inventory %v, want %v", got, want)
	}
	m.Close()
	pub.Close()
	settleGoroutines(t, base)
}
