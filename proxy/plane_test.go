package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/internal/natstest"
)

func planeOf(cfg Config, role, url string) Config {
	cfg.Plane = PlaneConfig{Kind: "jetstream", Role: role, NATSURL: url,
		SnapshotInterval: 500 * time.Millisecond, MaxAge: time.Minute}
	return cfg
}

func planeStates(t *testing.T, s *Server) map[string]string {
	t.Helper()
	_, body := get(t, s.admURL("/debug/inventory"))
	var inv struct {
		Endpoints []struct{ Name, Plane string }
	}
	if err := json.Unmarshal([]byte(body), &inv); err != nil {
		t.Fatal(err, body)
	}
	out := map[string]string{}
	for _, e := range inv.Endpoints {
		out[e.Name] = e.Plane
	}
	return out
}

// TestPlaneRouteReplica: a route replica configured without any engine event address
// routes KV hits from the plane an ingest replica feeds; killing nats-server fails no
// request (it routes on what it has, degraded on /debug/inventory and /metrics), and
// events sent during the outage reach it once the server returns.
func TestPlaneRouteReplica(t *testing.T) {
	ns := natstest.Start(t)
	c := vllmChain(t)
	a, b := newKVEngine(t, "a", enginepub.VLLM), newKVEngine(t, "b", enginepub.VLLM)
	ing := startProxy(t, planeOf(kvConfig(t, KVConverged, a.spec(0, "vllm", ""), b.spec(1, "vllm", "")), "ingest", ns.URL))
	route := startProxy(t, planeOf(kvConfig(t, KVConverged,
		fmt.Sprintf("name=a,url=%s,engine=vllm", a.url()), fmt.Sprintf("name=b,url=%s,engine=vllm", b.url())), "route", ns.URL))

	toks := engineTokens(t, sharedPrefix)
	b.store(t, c, toks, 8)
	waitFor(t, "route replica in sync", func() bool {
		st := planeStates(t, route)
		return route.kv.inv.Count(1) == 8 && st["a"] == "route: ok" && st["b"] == "route: ok"
	})
	if st := planeStates(t, ing); st["b"] != "ingest: publishing" {
		t.Fatalf("ingest replica plane state %q", st["b"])
	}
	hit := func(what, want string) {
		t.Helper()
		res, body := post(t, route.url("/v1/completions"), complPrompt(sharedPrefix+"What is next?"))
		if res.StatusCode != 200 || res.Header.Get("x-kvgate-endpoint") != want || res.Header.Get("x-kvgate-route") != "kv-hit" {
			t.Fatalf("%s: %d endpoint=%s route=%s %s", what, res.StatusCode, res.Header.Get("x-kvgate-endpoint"), res.Header.Get("x-kvgate-route"), body)
		}
	}
	hit("plane up", "b")

	ns.Kill()
	waitFor(t, "degraded on /debug/inventory", func() bool {
		return strings.HasPrefix(planeStates(t, route)["b"], "route: degraded (plane down")
	})
	_, m := get(t, route.admURL("/metrics"))
	if !strings.Contains(m, `kvgate_plane_route_state{endpoint="b"} 2`) || !strings.Contains(m, "kvgate_plane_route_connected 0") {
		t.Fatalf("metrics do not show the outage:\n%s", grepLines(m, "plane", "events_connected"))
	}
	for i := 0; i < 5; i++ {
		hit("plane down", "b")
	}
	// a now holds a longer run of the prefix: learned only after the server returns.
	a.store(t, c, toks, len(toks)/blockSize)
	waitFor(t, "ingest replica applied a's blocks", func() bool { return ing.kv.inv.Count(0) == len(toks)/blockSize })
	if route.kv.inv.Count(0) != 0 {
		t.Fatal("route replica learned a's blocks with the plane down")
	}
	ns.Start()
	waitFor(t, "route replica resynced", func() bool {
		return route.kv.inv.Count(0) == len(toks)/blockSize && planeStates(t, route)["a"] == "route: ok"
	})
	hit("plane back", "a")
}

func grepLines(s string, subs ...string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		for _, sub := range subs {
			if strings.Contains(l, sub) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// TestPlaneRouteFallback: a route replica given the engines' events= addresses follows
// them directly while nats-server is down (its requests route on events the plane could
// not carry), then goes back to the plane.
func TestPlaneRouteFallback(t *testing.T) {
	ns := natstest.Start(t)
	c := vllmChain(t)
	a, b := newKVEngine(t, "a", enginepub.VLLM), newKVEngine(t, "b", enginepub.VLLM)
	specs := []string{a.spec(0, "vllm", ""), b.spec(1, "vllm", "")}
	ing := startProxy(t, planeOf(kvConfig(t, KVConverged, specs...), "ingest", ns.URL))
	route := startProxy(t, planeOf(kvConfig(t, KVConverged, specs...), "route", ns.URL))
	toks := engineTokens(t, sharedPrefix)
	b.store(t, c, toks, 4)
	waitFor(t, "route replica in sync", func() bool {
		return route.kv.inv.Count(1) == 4 && planeStates(t, route)["b"] == "route: ok"
	})
	ns.Kill()
	waitFor(t, "direct fallback connected", func() bool {
		return strings.Contains(planeStates(t, route)["a"], "following the engine directly") && route.kv.mgr.Status(0).Connected
	})
	// Re-publish until the fallback's fresh subscription sees it (ZeroMQ's slow joiner).
	waitFor(t, "a's blocks through the fallback", func() bool {
		a.store(t, c, toks, len(toks)/blockSize)
		time.Sleep(20 * time.Millisecond)
		return route.kv.inv.Count(0) == len(toks)/blockSize
	})
	res, body := post(t, route.url("/v1/completions"), complPrompt(sharedPrefix+"What is next?"))
	if res.StatusCode != 200 || res.Header.Get("x-kvgate-endpoint") != "a" || res.Header.Get("x-kvgate-route") != "kv-hit" {
		t.Fatalf("during the outage: %d endpoint=%s route=%s %s", res.StatusCode, res.Header.Get("x-kvgate-endpoint"), res.Header.Get("x-kvgate-route"), body)
	}
	ns.Start()
	waitFor(t, "back on the plane", func() bool {
		st := planeStates(t, route)
		return st["a"] == "route: ok" && st["b"] == "route: ok" && route.kv.inv.Count(0) == ing.kv.inv.Count(0)
	})
}

// TestPlaneTRTDrainOnce: the ingest replica alone drains the TensorRT-LLM engine; the
// route replica routes on its blocks from the plane and never drains, not even while the
// plane is down and it follows the vLLM engine directly.
func TestPlaneTRTDrainOnce(t *testing.T) {
	ns := natstest.Start(t)
	v := newKVEngine(t, "v", enginepub.VLLM)
	q := &enginepub.TRTQueue{}
	// One engine, reached under two URLs, so each replica's drains are counted apart.
	drainer := func() *fakeEngine {
		e := newFakeEngine(t, "trt")
		e.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
			if r.URL.Path == "/kv_cache_events" {
				w.Header().Set("Content-Type", "application/json")
				w.Write(q.Drain(nil))
				return true
			}
			return false
		}
		return e
	}
	viaIngest, viaRoute := drainer(), drainer()
	ing := startProxy(t, planeOf(kvConfig(t, KVConverged, v.spec(0, "vllm", ""),
		fmt.Sprintf("name=trt,url=%s,engine=trtllm", viaIngest.url())), "ingest", ns.URL))
	route := startProxy(t, planeOf(kvConfig(t, KVConverged, v.spec(0, "vllm", ""),
		fmt.Sprintf("name=trt,url=%s,engine=trtllm", viaRoute.url())), "route", ns.URL))
	toks := engineTokens(t, sharedPrefix)
	var blocks []enginepub.TRTBlock
	for i := 0; i < 6; i++ {
		blocks = append(blocks, enginepub.TRTBlock{Hash: uint64(1000 + i), Tokens: toks[i*blockSize : (i+1)*blockSize]})
	}
	q.Stored(0, false, blocks...)
	waitFor(t, "TensorRT-LLM blocks on the route replica", func() bool {
		return route.kv.inv.Count(1) == 6 && planeStates(t, route)["trt"] == "route: ok"
	})
	if !route.kv.mgr.UsesFastKeys(1) || route.kv.mgr.UsesFastKeys(0) || ing.kv.inv.Count(1) != 6 {
		t.Fatalf("key kinds on the route replica: vllm fast=%v trt fast=%v", route.kv.mgr.UsesFastKeys(0), route.kv.mgr.UsesFastKeys(1))
	}
	res, body := post(t, route.url("/v1/completions"), complPrompt(sharedPrefix))
	if res.StatusCode != 200 || res.Header.Get("x-kvgate-endpoint") != "trt" || res.Header.Get("x-kvgate-route") != "kv-hit" {
		t.Fatalf("%d %s %s %s", res.StatusCode, res.Header.Get("x-kvgate-endpoint"), res.Header.Get("x-kvgate-route"), body)
	}
	ns.Kill()
	waitFor(t, "vLLM fallback running", func() bool {
		return strings.Contains(planeStates(t, route)["v"], "following the engine directly")
	})
	time.Sleep(200 * time.Millisecond) // a drain poller would have polled many times by now
	if n := viaRoute.count("/kv_cache_events"); n != 0 || viaIngest.count("/kv_cache_events") == 0 {
		t.Fatalf("route replica drained %d times (ingest %d)", n, viaIngest.count("/kv_cache_events"))
	}
	if st := planeStates(t, route)["trt"]; !strings.HasPrefix(st, "route: degraded (plane down") {
		t.Fatalf("trt plane state %q", st)
	}
}
