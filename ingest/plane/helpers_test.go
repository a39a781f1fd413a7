package plane

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/ingest"
	"github.com/kvgate/kvgate/internal/natstest"
	"github.com/kvgate/kvgate/shard"
)

func testPlaneConfig(url string) Config {
	// Small chunks: every snapshot of more than 16 keys spans several messages.
	return Config{URL: url, SnapshotInterval: 500 * time.Millisecond, MaxAge: time.Minute,
		MinSnapshotGap: 100 * time.Millisecond, ReconnectWait: 50 * time.Millisecond, ChunkKeys: 16}
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

// waitFor polls cond until it holds or the deadline passes (a bound on a hang).
func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// logBuf is a concurrency-safe slog sink.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuf) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// ingestReplica is an ingest replica: an ingest.Manager following real engine
// publishers, writing through the plane's Ingest into its own inventory.
type ingestReplica struct {
	inv *shard.Inventory
	g   *Ingest
	m   *ingest.Manager
}

func startIngest(t testing.TB, pcfg Config, icfg ingest.Config, eps []ingest.EndpointConfig) *ingestReplica {
	t.Helper()
	inv := newInv(t)
	var peps []Endpoint
	for _, e := range eps {
		peps = append(peps, Endpoint{Name: e.Name, Index: e.Index, Engine: e.Engine})
	}
	g, err := NewIngest(pcfg, inv, peps)
	if err != nil {
		t.Fatal(err)
	}
	icfg.Inventory = g
	if icfg.RetryInterval == 0 {
		icfg.RetryInterval, icfg.MaxRetryInterval = 20*time.Millisecond, 100*time.Millisecond
	}
	m, err := ingest.NewManager(icfg, eps)
	if err != nil {
		t.Fatal(err)
	}
	g.SetKeyKind(m.UsesFastKeys)
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	m.Start(context.Background())
	r := &ingestReplica{inv: inv, g: g, m: m}
	t.Cleanup(func() { m.Close(); g.Close() })
	return r
}

type routeReplica struct {
	inv *shard.Inventory
	r   *Route
	set *metrics.Set
}

func startRoute(t testing.TB, pcfg Config, eps []Endpoint) *routeReplica {
	t.Helper()
	inv := newInv(t)
	if pcfg.Metrics == nil {
		pcfg.Metrics = metrics.NewSet()
	}
	r, err := NewRoute(pcfg, inv, eps)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return &routeReplica{inv: inv, r: r, set: pcfg.Metrics}
}

func (rr *routeReplica) metric(name string) string {
	var b bytes.Buffer
	rr.set.WritePrometheus(&b)
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, name+" ") {
			return strings.TrimPrefix(l, name+" ")
		}
	}
	return ""
}

func newPub(t testing.TB) *enginepub.Publisher {
	t.Helper()
	var err error
	for try := 0; try < 20; try++ {
		var p *enginepub.Publisher
		p, err = enginepub.New(enginepub.Config{Endpoint: "tcp://127.0.0.1:0"})
		if err == nil {
			t.Cleanup(func() { p.Close() })
			return p
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal(err)
	return nil
}

func waitSubscribed(t testing.TB, p *enginepub.Publisher) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := p.WaitSubscribed(ctx); err != nil {
		t.Fatalf("no subscriber: %v", err)
	}
}

// model is the test's own account of what an endpoint holds, from the events it sends
// (the oracle: it never reads kvgate's state).
type model map[uint64]bool

func (m model) keys() []uint64 {
	out := make([]uint64, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func sameKeys(a, b []uint64) bool { return slices.Equal(a, b) }

func describe(name string, got, want []uint64) string {
	return fmt.Sprintf("%s: %d keys, want %d", name, len(got), len(want))
}

func startNATS(t testing.TB) *natstest.Server { return natstest.Start(t) }
