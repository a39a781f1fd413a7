package ingest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/internal/freeport"
	"github.com/kvgate/kvgate/shard"
)

// freeAddr returns tcp://127.0.0.1:P for a port free right now, with n consecutive ports
// free (data-parallel ranks use base+r).
func freeAddr(t testing.TB, n int) string {
	t.Helper()
	p, err := freeport.Pick(n)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("tcp://127.0.0.1:%d", p)
}

func newInv(t testing.TB) *shard.Inventory {
	t.Helper()
	inv, err := shard.New(shard.Config{Endpoints: 8, Shards: 8})
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// invKeys lists endpoint ep's keys, sorted.
func invKeys(inv *shard.Inventory, ep int) []uint64 {
	var out []uint64
	var cur uint64
	for {
		out, cur = inv.Keys(ep, cur, 0, out)
		if cur == 0 {
			break
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func sorted(k []uint64) []uint64 {
	k = slices.Clone(k)
	slices.Sort(k)
	return slices.Compact(k)
}

// waitFor polls cond until it holds or the deadline passes. Deadlines here bound a hang,
// they assert no timing.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func testConfig(inv *shard.Inventory) Config {
	return Config{
		Inventory:     inv,
		Keys:          KeysEngine,
		RetryInterval: 20 * time.Millisecond, MaxRetryInterval: 100 * time.Millisecond,
		DialTimeout: 2 * time.Second, ReplayTimeout: 5 * time.Second,
	}
}

func startManager(t testing.TB, cfg Config, eps ...EndpointConfig) *Manager {
	t.Helper()
	m, err := NewManager(cfg, eps)
	if err != nil {
		t.Fatal(err)
	}
	m.Start(context.Background())
	t.Cleanup(func() { m.Close() })
	return m
}

func newPub(t testing.TB, cfg enginepub.Config) *enginepub.Publisher {
	t.Helper()
	var p *enginepub.Publisher
	var err error
	for try := 0; try < 20; try++ { // retry on a port taken between probe and bind
		p, err = enginepub.New(cfg)
		if err == nil {
			t.Cleanup(func() { p.Close() })
			return p
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal(err)
	return nil
}

// waitSubscribed waits until the publisher has a subscriber.
func waitSubscribed(t testing.TB, p *enginepub.Publisher) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := p.WaitSubscribed(ctx); err != nil {
		t.Fatalf("no subscriber: %v", err)
	}
}

// liveGoroutines counts goroutines, less zmq4's PUB writers: zmq4's socket.Close never
// stops a PUB socket's pubMWriter.run goroutine (a leak of the engine-side publisher that
// enginepub cannot reach; kvgate's subscribers have no PUB socket).
func liveGoroutines() (int, string) {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.TrimSpace(g) != "" && !strings.Contains(g, "pubMWriter).run") {
			n++
		}
	}
	return n, string(buf)
}

// settleGoroutines waits until no more goroutines run than base (from liveGoroutines).
func settleGoroutines(t testing.TB, base int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, buf := liveGoroutines()
		if n <= base {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines leaked: %d > %d\n%s", n, base, leakSummary(buf))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func leakSummary(s string) string {
	var b strings.Builder
	for _, g := range strings.Split(s, "\n\n") {
		if strings.Contains(g, "zmq4") || strings.Contains(g, "ingest") {
			b.WriteString(g)
			b.WriteString("\n\n")
		}
	}
	return b.String()
}

// parseMedia parses a comma list of tiers as the holder goldens name them (gpu, cpu, storage, external; SGLang's
// cpu_pinned and disk name cpu and storage).
func parseMedia(s string) (Media, error) {
	var m Media
	for _, f := range strings.Split(s, ",") {
		switch strings.ToUpper(strings.TrimSpace(f)) {
		case "GPU":
			m |= 1 << MediumGPU
		case "CPU", "CPU_PINNED":
			m |= 1 << MediumCPU
		case "STORAGE", "DISK":
			m |= 1 << MediumStorage
		case "EXTERNAL":
			m |= 1 << MediumExternal
		case "":
		default:
			return 0, fmt.Errorf("ingest: medium %q: want gpu, cpu, storage or external", f)
		}
	}
	if m == 0 {
		return 0, errors.New("ingest: no medium to route on")
	}
	return m, nil
}
