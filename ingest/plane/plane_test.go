package plane

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/engine"
	"github.com/kvgate/kvgate/hashcore"
	"github.com/kvgate/kvgate/ingest"
)

// vllmEndpoints starts n engine publishers and returns their ingest configs.
func vllmEndpoints(t *testing.T, names ...string) ([]*enginepub.Publisher, []ingest.EndpointConfig, []Endpoint) {
	var pubs []*enginepub.Publisher
	var ieps []ingest.EndpointConfig
	var peps []Endpoint
	for i, n := range names {
		p := newPub(t)
		pubs = append(pubs, p)
		ieps = append(ieps, ingest.EndpointConfig{Name: n, Index: i, Engine: engine.VLLM, Events: p.Addr()})
		peps = append(peps, Endpoint{Name: n, Index: i, Engine: engine.VLLM})
	}
	return pubs, ieps, peps
}

// engineLoad sends store/remove/clear events and keeps the oracle model of each endpoint.
type engineLoad struct {
	pubs   []*enginepub.Publisher
	models []model
	next   uint64
}

func newLoad(pubs []*enginepub.Publisher) *engineLoad {
	l := &engineLoad{pubs: pubs, next: 1 << 40}
	for range pubs {
		l.models = append(l.models, model{})
	}
	return l
}

func (l *engineLoad) store(t *testing.T, ep, n int) []uint64 {
	hs := make([]uint64, n)
	for i := range hs {
		l.next += 0x9E3779B97F4A7C15
		hs[i] = l.next
		l.models[ep][hs[i]] = true
	}
	if err := l.pubs[ep].Publish(enginepub.BlockStored{Hashes: hs, BlockSize: 16}); err != nil {
		t.Error(err)
	}
	return hs
}

func (l *engineLoad) remove(t *testing.T, ep int, hs []uint64) {
	for _, h := range hs {
		delete(l.models[ep], h)
	}
	if err := l.pubs[ep].Publish(enginepub.BlockRemoved{Hashes: hs}); err != nil {
		t.Error(err)
	}
}

func (l *engineLoad) clear(t *testing.T, ep int) {
	clear(l.models[ep])
	if err := l.pubs[ep].Publish(enginepub.AllBlocksCleared{}); err != nil {
		t.Error(err)
	}
}

// agree waits until every replica holds exactly the model's keys for every endpoint.
func agree(t *testing.T, what string, d time.Duration, l *engineLoad, ing *ingestReplica, routes ...*routeReplica) {
	t.Helper()
	var last string
	ok := func() bool {
		for ep, m := range l.models {
			want := m.keys()
			if got := invKeys(ing.inv, ep); !sameKeys(got, want) {
				last = describe("ingest", got, want)
				return false
			}
			for i, r := range routes {
				if got := invKeys(r.inv, ep); !sameKeys(got, want) {
					last = describe("route "+string(rune('A'+i)), got, want)
					return false
				}
				if st, why := r.r.State(ep); st != StateOK {
					last = "route state " + st + ": " + why
					return false
				}
			}
		}
		return true
	}
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: replicas disagree after %v: %s", what, d, last)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTwoRoutesAgree: one ingest replica follows two vLLM engines; two route replicas fed
// only by the plane hold exactly the engines' key sets through stores, removes and a
// clear.
func TestTwoRoutesAgree(t *testing.T) {
	ns := startNATS(t)
	pcfg := testPlaneConfig(ns.URL)
	pubs, ieps, peps := vllmEndpoints(t, "a", "b.dotted name")
	ing := startIngest(t, pcfg, ingest.Config{Keys: ingest.KeysEngine}, ieps)
	for _, p := range pubs {
		waitSubscribed(t, p)
	}
	ra, rb := startRoute(t, pcfg, peps), startRoute(t, pcfg, peps)
	l := newLoad(pubs)
	var olds [][]uint64
	for i := 0; i < 50; i++ {
		olds = append(olds, l.store(t, i%2, 8))
	}
	agree(t, "after stores", 15*time.Second, l, ing, ra, rb)
	for i := 0; i < 50; i += 3 {
		l.remove(t, i%2, olds[i][:4])
	}
	l.clear(t, 1)
	l.store(t, 1, 5)
	l.store(t, 0, 100) // one event of 100 blocks: published as 7 messages of 16 keys at most
	agree(t, "after removes, a clear and a large event", 15*time.Second, l, ing, ra, rb)
	if n := len(l.models[0]); n == 0 || ra.inv.Count(0) != n {
		t.Fatalf("endpoint a holds %d keys, model %d", ra.inv.Count(0), n)
	}
	for _, r := range []*routeReplica{ra, rb} {
		if r.r.UsesFastKeys(0) || r.r.UsesFastKeys(1) {
			t.Fatal("vLLM engine keys reported as fast keys")
		}
		if st := r.r.Status(1); !st.Connected || st.Keys != len(l.models[1]) || st.LastSeq <= 0 {
			t.Fatalf("status %+v", st)
		}
		if r.metric(`kvgate_plane_route_state{endpoint="a"}`) != "0" || r.metric("kvgate_plane_route_connected") != "1" {
			t.Fatal("metrics do not show the endpoint in sync")
		}
	}
	// Periodic snapshots of endpoints in sync change nothing: no reconcile, and the key
	// count never dips while they arrive.
	e := ra.r.eps[0]
	snaps, recs, n := e.snapshots.Get(), e.reconciled.Get(), ra.inv.Count(0)
	for end := time.Now().Add(1200 * time.Millisecond); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if c := ra.inv.Count(0); c != n {
			t.Fatalf("key count moved from %d to %d with no event", n, c)
		}
	}
	if e.snapshots.Get() < snaps+2 || e.reconciled.Get() != recs {
		t.Fatalf("snapshots %d -> %d, reconciles %d -> %d", snaps, e.snapshots.Get(), recs, e.reconciled.Get())
	}
}

// TestRouteRestartWarm: a route replica restarted while events flow is warm (in sync,
// holding keys stored long before it started) within seconds, from the newest snapshot
// plus the stream behind it.
func TestRouteRestartWarm(t *testing.T) {
	ns := startNATS(t)
	pcfg := testPlaneConfig(ns.URL)
	pubs, ieps, peps := vllmEndpoints(t, "a", "b")
	ing := startIngest(t, pcfg, ingest.Config{Keys: ingest.KeysEngine}, ieps)
	for _, p := range pubs {
		waitSubscribed(t, p)
	}
	l := newLoad(pubs)
	early := l.store(t, 0, 64) // never removed: must be on the restarted replica
	r1 := startRoute(t, pcfg, peps)
	agree(t, "first replica", 15*time.Second, l, ing, r1)

	var stop atomic.Bool
	var mu sync.Mutex // guards l while the load runs
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var recent [][]uint64
		for i := 0; !stop.Load(); i++ {
			mu.Lock()
			recent = append(recent, l.store(t, i%2, 4))
			if len(recent) > 20 {
				l.remove(t, (i-20)%2, recent[0])
				recent = recent[1:]
			}
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	time.Sleep(1200 * time.Millisecond) // past at least two snapshot intervals
	r1.r.Close()
	t0 := time.Now()
	r2 := startRoute(t, pcfg, peps)
	waitFor(t, "restarted replica in sync", 5*time.Second, func() bool {
		a, _ := r2.r.State(0)
		b, _ := r2.r.State(1)
		return a == StateOK && b == StateOK
	})
	warm := time.Since(t0)
	for _, k := range early {
		if got := invKeys(r2.inv, 0); !slices.Contains(got, k) {
			t.Fatalf("warm replica lacks early key %x", k)
		}
	}
	if r2.metric(`kvgate_plane_route_snapshots_total{endpoint="a"}`) == "0" {
		t.Fatal("warm start applied no snapshot")
	}
	t.Logf("restarted route replica in sync after %v with %d+%d keys, events flowing", warm, r2.inv.Count(0), r2.inv.Count(1))
	time.Sleep(300 * time.Millisecond) // keep the load on while in sync
	stop.Store(true)
	wg.Wait()
	agree(t, "after the load", 15*time.Second, l, ing, r2)
}

// TestNATSKilledDegradesAndResyncs: killing nats-server leaves a route replica routing on
// what it had, explicitly degraded (state, WARN, metric); events the engines send
// meanwhile reach it after the server returns, through a fresh snapshot.
func TestNATSKilledDegradesAndResyncs(t *testing.T) {
	ns := startNATS(t)
	var logs logBuf
	pcfg := testPlaneConfig(ns.URL)
	pubs, ieps, peps := vllmEndpoints(t, "a")
	icfg := pcfg
	icfg.Logger = logs.logger()
	ing := startIngest(t, icfg, ingest.Config{Keys: ingest.KeysEngine}, ieps)
	waitSubscribed(t, pubs[0])
	rcfg := pcfg
	rcfg.Logger = logs.logger()
	r := startRoute(t, rcfg, peps)
	l := newLoad(pubs)
	old := l.store(t, 0, 32)
	agree(t, "before the outage", 15*time.Second, l, ing, r)
	before := invKeys(r.inv, 0)

	ns.Kill()
	waitFor(t, "degraded state", 10*time.Second, func() bool {
		st, why := r.r.State(0)
		return st == StateDegraded && strings.Contains(why, "plane down")
	})
	if r.metric(`kvgate_plane_route_state{endpoint="a"}`) != "2" || r.metric("kvgate_plane_route_connected") != "0" {
		t.Fatal("metrics do not show the outage")
	}
	if s := logs.String(); !strings.Contains(s, "level=WARN") || !strings.Contains(s, "plane down") {
		t.Fatalf("no WARN for the outage:\n%s", s)
	}
	if st := r.r.Status(0); st.Connected {
		t.Fatalf("status connected during the outage: %+v", st)
	}
	// The engine goes on: the ingest replica applies, the plane cannot carry it.
	l.remove(t, 0, old[:8])
	l.store(t, 0, 16)
	waitFor(t, "ingest applied the outage's events", 10*time.Second, func() bool {
		return sameKeys(invKeys(ing.inv, 0), l.models[0].keys())
	})
	if got := invKeys(r.inv, 0); !sameKeys(got, before) {
		t.Fatalf("route replica's inventory changed during the outage: %d keys, had %d", len(got), len(before))
	}

	ns.Start()
	agree(t, "after the server returned", 20*time.Second, l, ing, r)
	l.store(t, 0, 4)
	agree(t, "live again", 15*time.Second, l, ing, r)
}

// TestTRTDrainShared: one ingest replica drains a TensorRT-LLM engine (every drain is
// destructive); two route replicas see its blocks, as kvgate's fast keys.
func TestTRTDrainShared(t *testing.T) {
	const bs = 8
	ns := startNATS(t)
	pcfg := testPlaneConfig(ns.URL)
	var q enginepub.TRTQueue
	var drains atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/kv_cache_events" {
			http.Error(w, "no", http.StatusNotFound)
			return
		}
		drains.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Write(q.Drain(nil))
	}))
	defer srv.Close()
	ieps := []ingest.EndpointConfig{{Name: "trt", Index: 0, Engine: engine.TRTLLM, URL: srv.URL}}
	peps := []Endpoint{{Name: "trt", Index: 0, Engine: engine.TRTLLM}}
	ing := startIngest(t, pcfg, ingest.Config{Fast: hashcore.NewFast(bs)}, ieps)
	ra, rb := startRoute(t, pcfg, peps), startRoute(t, pcfg, peps)
	tok := func(start int) []uint32 {
		out := make([]uint32, bs)
		for i := range out {
			out[i] = uint32(start + i)
		}
		return out
	}
	A0, A1, B0 := tok(0), tok(100), tok(200)
	q.Created(100, 10)
	q.Stored(0, false, enginepub.TRTBlock{Hash: 1 << 63, Tokens: A0}, enginepub.TRTBlock{Hash: 11, Tokens: A1})
	q.Stored(11, true, enginepub.TRTBlock{Hash: 12, Tokens: B0})
	// The oracle: the request path's own fast keys of each prefix.
	fk := func(prefix ...[]uint32) uint64 {
		k := hashcore.Keys(hashcore.NewFast(bs), nil, slices.Concat(prefix...), nil)
		return k[len(k)-1]
	}
	l := &engineLoad{models: []model{{fk(A0): true, fk(A0, A1): true, fk(A0, A1, B0): true}}}
	agree(t, "stored", 15*time.Second, l, ing, ra, rb)
	q.Removed(11)
	delete(l.models[0], fk(A0, A1))
	agree(t, "removed", 15*time.Second, l, ing, ra, rb)
	if q.Len() != 0 || drains.Load() == 0 {
		t.Fatalf("queue %d, drains %d", q.Len(), drains.Load())
	}
	for _, r := range []*routeReplica{ra, rb} {
		if !r.r.UsesFastKeys(0) || !r.r.Status(0).Rehash {
			t.Fatal("route replica does not know the TensorRT-LLM endpoint holds fast keys")
		}
	}
}

// TestIngestRestartNewEpoch: a restarted ingest replica publishes under a new epoch; its
// first snapshot replaces what route replicas held from the old one, and they follow it.
func TestIngestRestartNewEpoch(t *testing.T) {
	ns := startNATS(t)
	pcfg := testPlaneConfig(ns.URL)
	pubs, ieps, peps := vllmEndpoints(t, "a")
	ing := startIngest(t, pcfg, ingest.Config{Keys: ingest.KeysEngine}, ieps)
	waitSubscribed(t, pubs[0])
	r := startRoute(t, pcfg, peps)
	l := newLoad(pubs)
	l.store(t, 0, 16)
	agree(t, "first epoch", 15*time.Second, l, ing, r)
	ing.m.Close()
	ing.g.Close()
	oldEpoch := r.r.eps[0].epoch
	// Nothing publishes: after 3 snapshot intervals the endpoint is stale, keys kept.
	waitFor(t, "stale", 10*time.Second, func() bool {
		st, why := r.r.State(0)
		return st == StateDegraded && strings.Contains(why, "stale")
	})
	if r.inv.Count(0) != 16 {
		t.Fatalf("stale endpoint lost its keys: %d", r.inv.Count(0))
	}

	// The new replica knows only what the engine sends from now on (no replay socket).
	clear(l.models[0])
	ing2 := startIngest(t, pcfg, ingest.Config{Keys: ingest.KeysEngine}, ieps)
	// The publisher may still list the old replica's subscription: send a probe block
	// until the new replica has it, so nothing after it is lost to the slow joiner.
	probe := uint64(0xfeed)
	l.models[0][probe] = true
	waitFor(t, "new ingest replica subscribed", 15*time.Second, func() bool {
		pubs[0].Publish(enginepub.BlockStored{Hashes: []uint64{probe}, BlockSize: 16})
		time.Sleep(10 * time.Millisecond)
		return ing2.inv.Count(0) > 0
	})
	l.store(t, 0, 8)
	agree(t, "second epoch", 15*time.Second, l, ing2, r)
	if r.r.eps[0].epoch == oldEpoch {
		t.Fatal("route replica still on the old epoch")
	}
	if r.metric(`kvgate_plane_route_dual_ingest_total{endpoint="a"}`) != "0" {
		t.Fatal("a restart taken for two ingest replicas")
	}
}

// TestPlaneStartsBeforeNATS: replicas started while nats-server is down start anyway
// (degraded / syncing) and converge once it comes up.
func TestPlaneStartsBeforeNATS(t *testing.T) {
	ns := startNATS(t)
	ns.Kill()
	pcfg := testPlaneConfig(ns.URL)
	pubs, ieps, peps := vllmEndpoints(t, "a")
	ing := startIngest(t, pcfg, ingest.Config{Keys: ingest.KeysEngine}, ieps)
	waitSubscribed(t, pubs[0])
	r := startRoute(t, pcfg, peps)
	l := newLoad(pubs)
	l.store(t, 0, 40)
	waitFor(t, "ingest applied", 10*time.Second, func() bool { return ing.inv.Count(0) == 40 })
	if st, _ := r.r.State(0); st == StateOK || r.r.Connected() || ing.g.Connected() {
		t.Fatalf("in sync with no server: %s", st)
	}
	ns.Start()
	agree(t, "after the server started", 20*time.Second, l, ing, r)
}

// TestRouteFallsBackToDirect: a route replica that knows an engine's events address
// follows it directly while nats-server is down, and hands back to the plane when it
// returns.
func TestRouteFallsBackToDirect(t *testing.T) {
	ns := startNATS(t)
	var logs logBuf
	pcfg := testPlaneConfig(ns.URL)
	pubs, ieps, peps := vllmEndpoints(t, "a")
	ing := startIngest(t, pcfg, ingest.Config{Keys: ingest.KeysEngine}, ieps)
	waitSubscribed(t, pubs[0])
	rcfg := pcfg
	rcfg.Logger = logs.logger()
	inv := newInv(t)
	r, err := NewRoute(rcfg, inv, peps)
	if err != nil {
		t.Fatal(err)
	}
	var started atomic.Int32
	r.SetFallback(&Fallback{Covers: []bool{true}, After: 200 * time.Millisecond, New: func() (Source, error) {
		started.Add(1)
		return ingest.NewManager(ingest.Config{Inventory: inv, Keys: ingest.KeysEngine,
			RetryInterval: 20 * time.Millisecond, MaxRetryInterval: 100 * time.Millisecond}, ieps)
	}})
	if err := r.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	rr := &routeReplica{inv: inv, r: r}
	l := newLoad(pubs)
	l.store(t, 0, 10)
	agree(t, "before the outage", 15*time.Second, l, ing, rr)
	if started.Load() != 0 {
		t.Fatal("fell back with the plane up")
	}

	gen := r.KeyGen()
	ns.Kill()
	waitFor(t, "direct fallback subscribed", 10*time.Second, func() bool {
		_, why := r.State(0)
		return strings.Contains(why, "directly") && r.Status(0).Connected
	})
	if r.KeyGen() == gen { // the fallback answers UsesFastKeys now
		t.Fatal("KeyGen did not move when the fallback started")
	}
	probe := uint64(0xbeef)
	l.models[0][probe] = true
	waitFor(t, "fallback applies engine events", 10*time.Second, func() bool {
		pubs[0].Publish(enginepub.BlockStored{Hashes: []uint64{probe}, BlockSize: 16})
		time.Sleep(10 * time.Millisecond)
		return slices.Contains(invKeys(inv, 0), probe)
	})
	l.store(t, 0, 6)
	waitFor(t, "outage's events on the route replica", 10*time.Second, func() bool {
		return sameKeys(invKeys(inv, 0), l.models[0].keys())
	})
	if s := logs.String(); !strings.Contains(s, "following the engines directly") {
		t.Fatalf("no WARN for the fallback:\n%s", s)
	}

	ns.Start()
	agree(t, "back on the plane", 20*time.Second, l, ing, rr)
	if r.fallbackSource() != nil || started.Load() != 1 {
		t.Fatalf("fallback still running (started %d)", started.Load())
	}
	if g := r.KeyGen(); g < gen+2 {
		t.Fatalf("KeyGen %d: did not move again when the fallback stopped (before it: %d)", g, gen)
	}
	l.store(t, 0, 3)
	agree(t, "live on the plane", 15*time.Second, l, ing, rr)
}

// TestDualIngestWarns: two ingest replicas publishing one endpoint (a misconfiguration)
// are named in a WARN and counted.
func TestDualIngestWarns(t *testing.T) {
	ns := startNATS(t)
	var logs logBuf
	pcfg := testPlaneConfig(ns.URL)
	pubs, ieps, peps := vllmEndpoints(t, "a")
	startIngest(t, pcfg, ingest.Config{Keys: ingest.KeysEngine}, ieps)
	startIngest(t, pcfg, ingest.Config{Keys: ingest.KeysEngine}, ieps)
	waitSubscribed(t, pubs[0])
	rcfg := pcfg
	rcfg.Logger = logs.logger()
	r := startRoute(t, rcfg, peps)
	l := newLoad(pubs)
	l.store(t, 0, 4)
	waitFor(t, "dual ingest detected", 15*time.Second, func() bool {
		return r.metric(`kvgate_plane_route_dual_ingest_total{endpoint="a"}`) != "0" &&
			strings.Contains(logs.String(), "two ingest replicas publish this endpoint")
	})
}

// TestServerLosesItsStore: nats-server comes back with no stream at all; the ingest
// replica recreates it and re-snapshots, and the route replica (whose consumer position
// is past the new stream's end) restarts from the newest snapshot.
func TestServerLosesItsStore(t *testing.T) {
	ns := startNATS(t)
	pcfg := testPlaneConfig(ns.URL)
	pubs, ieps, peps := vllmEndpoints(t, "a")
	ing := startIngest(t, pcfg, ingest.Config{Keys: ingest.KeysEngine}, ieps)
	waitSubscribed(t, pubs[0])
	r := startRoute(t, pcfg, peps)
	l := newLoad(pubs)
	for i := 0; i < 100; i++ { // move the consumer well past where a new stream starts
		l.store(t, 0, 2)
	}
	agree(t, "before", 15*time.Second, l, ing, r)
	ns.Kill()
	ns.Wipe()
	l.store(t, 0, 3)
	ns.Start()
	agree(t, "after the server lost its store", 20*time.Second, l, ing, r)
}

// TestIngestCloseFlushes: ops queued when an ingest replica stops gracefully still reach
// route replicas.
func TestIngestCloseFlushes(t *testing.T) {
	ns := startNATS(t)
	pcfg := testPlaneConfig(ns.URL)
	peps := []Endpoint{{Name: "a", Index: 0, Engine: engine.VLLM}}
	inv := newInv(t)
	g, err := NewIngest(pcfg, inv, peps)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	r := startRoute(t, pcfg, peps)
	waitFor(t, "route in sync", 15*time.Second, func() bool { s, _ := r.r.State(0); return s == StateOK })
	keys := make([]uint64, 4)
	for i := 0; i < 3000; i++ {
		for j := range keys {
			keys[j] = uint64(i*4+j+1) * 0x9E3779B97F4A7C15
		}
		g.Add(0, keys)
	}
	g.Close()
	if d := g.eps[0].dropped.Get(); d != 0 {
		t.Fatalf("%d ops dropped", d)
	}
	waitFor(t, "route has every op", 15*time.Second, func() bool { return r.inv.Count(0) == 12000 })
	if s, _ := r.r.State(0); s != StateOK {
		t.Fatalf("state %s after a clean stop", s)
	}
}
