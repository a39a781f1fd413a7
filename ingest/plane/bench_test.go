package plane

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/shard"
)

// BenchmarkRouteApply: a route replica applying consumed 64-key store messages (decode +
// inventory add), the NATS client's own delivery excluded.
func BenchmarkRouteApply(b *testing.B) {
	r, err := NewRoute(Config{URL: "nats://127.0.0.1:1"}, mustInv(b, 1<<22), []Endpoint{{Name: "a"}})
	if err != nil {
		b.Fatal(err)
	}
	r.up.Store(true)
	e := r.eps[0]
	e.apply(appendMsg(nil, header{op: OpSnapshot, epoch: 1, chunks: 1}, nil))
	const per = 64
	const nmsg = 1 << 14 // 1M distinct keys, then the same keys again (steady state)
	msgs := make([][]byte, nmsg)
	keys := make([]uint64, per)
	for i := range msgs {
		for j := range keys {
			keys[j] = uint64(i*per+j+1) * 0x9E3779B97F4A7C15
		}
		msgs[i] = appendMsg(nil, header{op: OpStore, epoch: 1}, keys)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m := msgs[i%nmsg]
		putSeq(m, uint64(i+1))
		e.apply(m)
	}
	b.ReportMetric(float64(b.N*per)/b.Elapsed().Seconds(), "keys/s")
}

func putSeq(m []byte, seq uint64) {
	for k := 0; k < 8; k++ {
		m[16+k] = byte(seq >> (8 * k))
	}
}

// BenchmarkSnapshot1M: an ingest replica's snapshot of a 1M-key endpoint: reading the
// keys and encoding the chunks, the time its ingest writes wait on the endpoint's lock.
func BenchmarkSnapshot1M(b *testing.B) {
	inv := mustInv(b, 1<<21)
	keys := make([]uint64, 1<<20)
	for i := range keys {
		keys[i] = uint64(i+1) * 0x9E3779B97F4A7C15
	}
	inv.Add(0, keys)
	g, err := NewIngest(Config{URL: "nats://127.0.0.1:1", Queue: 1 << 20}, inv, []Endpoint{{Name: "a"}})
	if err != nil {
		b.Fatal(err)
	}
	p := g.eps[0]
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		g.snapshot(p, time.Now())
		<-g.q
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/snapshot")
}

func mustInv(b *testing.B, perEP int) *shard.Inventory {
	inv, err := shard.New(shard.Config{Endpoints: 8, MaxKeysPerEndpoint: perEP})
	if err != nil {
		b.Fatal(err)
	}
	return inv
}

// BenchmarkIngestAdd: what the plane adds to an ingest replica's Add of 64 keys (apply,
// encode, queue), against the inventory alone. The queue is drained by a goroutine that
// discards, so NATS itself is excluded.
func BenchmarkIngestAdd(b *testing.B) {
	keys := make([]uint64, 64)
	run := func(b *testing.B, add func(ep int, keys []uint64) int) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			for j := range keys {
				keys[j] = uint64((i%(1<<14))*64+j+1) * 0x9E3779B97F4A7C15
			}
			add(0, keys)
		}
		b.ReportMetric(float64(b.N*len(keys))/b.Elapsed().Seconds(), "keys/s")
	}
	b.Run("inventory", func(b *testing.B) { run(b, mustInv(b, 1<<22).Add) })
	b.Run("plane", func(b *testing.B) {
		g, err := NewIngest(Config{URL: "nats://127.0.0.1:1"}, mustInv(b, 1<<22), []Endpoint{{Name: "a"}})
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			for {
				select {
				case <-g.q:
				case <-done:
					return
				}
			}
		}()
		defer close(done)
		run(b, g.Add)
	})
}

// BenchmarkPlaneThroughput: 64-key store ops from an ingest replica's Add to a route
// replica's inventory through a real nats-server (file store): ops/s end to end.
func BenchmarkPlaneThroughput(b *testing.B) {
	ns := startNATS(b)
	pcfg := testPlaneConfig(ns.URL)
	pcfg.ChunkKeys, pcfg.SnapshotInterval, pcfg.MaxAge = 0, time.Minute, 10*time.Minute
	pcfg.Queue = 1 << 16
	inv := mustInv(b, 1<<22)
	g, err := NewIngest(pcfg, inv, []Endpoint{{Name: "a"}})
	if err != nil {
		b.Fatal(err)
	}
	if err := g.Start(b.Context()); err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	rinv := mustInv(b, 1<<22)
	r, err := NewRoute(pcfg, rinv, []Endpoint{{Name: "a"}})
	if err != nil {
		b.Fatal(err)
	}
	if err := r.Start(b.Context()); err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	waitFor(b, "route in sync", 15*time.Second, func() bool { s, _ := r.State(0); return s == StateOK })
	keys := make([]uint64, 64)
	base := r.eps[0].lastSeq.Load()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range keys {
			keys[j] = uint64((i%(1<<14))*64+j+1) * 0x9E3779B97F4A7C15
		}
		g.Add(0, keys)
		if i%4096 == 4095 {
			for r.eps[0].lastSeq.Load() < base+int64(i)-8192 { // bound the backlog
				time.Sleep(100 * time.Microsecond)
			}
		}
	}
	waitFor(b, "route caught up", 60*time.Second, func() bool { return r.eps[0].lastSeq.Load() >= base+int64(b.N) })
	b.StopTimer()
	if d := g.eps[0].dropped.Get(); d > 0 {
		b.Fatalf("%d ops dropped", d)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	b.ReportMetric(float64(b.N*64)/b.Elapsed().Seconds(), "keys/s")
}
