package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/hashcore"
)

// logBuf is a slog sink tests read while the server writes.
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

// lines returns the log lines holding every one of subs.
func (l *logBuf) lines(subs ...string) []string {
	var out []string
	for _, line := range strings.Split(l.String(), "\n") {
		ok := line != ""
		for _, s := range subs {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// startLogged starts a server whose WARN+ log goes to the returned buffer, after tune
// (may be nil) adjusted it.
func startLogged(t *testing.T, cfg Config, tune func(*Server)) (*Server, *logBuf) {
	t.Helper()
	lb := &logBuf{}
	opt := Options{Logger: slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	if cfg.KV.Mode != KVOff {
		opt.Tokenizers = sharedPool(t)
	}
	s, err := New(cfg, opt)
	if err != nil {
		t.Fatal(err)
	}
	if tune != nil {
		tune(s)
	}
	if err := s.StartWith(context.Background(), listenLocal(t), listenLocal(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return s, lb
}

func fastStates(s *Server) {
	s.states.tun.every = 20 * time.Millisecond
	s.states.tun.disconnected = 200 * time.Millisecond
}

type invState struct {
	Name      string   `json:"name"`
	Routing   string   `json:"routing"`
	Reasons   []string `json:"degraded_reasons"`
	Why       string   `json:"routing_why"`
	Connected bool     `json:"connected"`
}

func inventoryStates(t *testing.T, s *Server) map[string]invState {
	t.Helper()
	res, err := httpc.Get(s.admURL("/debug/inventory"))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var inv struct{ Endpoints []invState }
	if err := json.NewDecoder(res.Body).Decode(&inv); err != nil {
		t.Fatal(err)
	}
	out := map[string]invState{}
	for _, e := range inv.Endpoints {
		out[e.Name] = e
	}
	return out
}

// Each endpoint's routing state follows its evidence: a wrong events= port, engine keys
// under another contract, and blocks of another size each degrade it with their own
// reason, at WARN, on /debug/inventory, /metrics and /readyz; a good endpoint stays
// exact. The startup log names the rule and each endpoint's contract.
func TestRoutingStatePerEndpoint(t *testing.T) {
	c := vllmChain(t)
	good := newKVEngine(t, "good", enginepub.VLLM)
	drift := newKVEngine(t, "drift", enginepub.VLLM)
	big := newKVEngine(t, "big", enginepub.VLLM)
	lost := newFakeEngine(t, "lost")
	lostSpec := "name=lost,url=" + lost.url() + ",engine=vllm,events=tcp://" + deadAddr(t)
	// http's events= answers, but as an HTTP server would, not as a ZeroMQ PUB: its reason
	// says so.
	wrong := newFakeEngine(t, "http")
	answerer := rawEngine(t, func(c net.Conn) {
		c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")) //nolint:errcheck
		c.Close()
	})
	wrongSpec := "name=http,url=" + wrong.url() + ",engine=vllm,events=tcp://" + strings.TrimPrefix(answerer, "http://")
	// big pins the rule's block size (block_size=16): unpinned it would adopt the 32 its
	// events prove (bench/enginesim TestBlockSizePerEndpoint).
	cfg := kvConfig(t, KVConverged, good.spec(0, "vllm", ""), drift.spec(1, "vllm", ""), big.spec(2, "vllm", ",block_size=16"), lostSpec, wrongSpec)
	s, lb := startLogged(t, cfg, fastStates)

	if l := lb.lines("kvgate rule", "kv_mode=\"3 (converged pool)\"", "qwen3"); len(l) != 1 {
		t.Errorf("startup rule line: %q", lb.String())
	}
	if l := lb.lines("kvgate endpoint", "endpoint=good", "vllm/sha256_cbor PYTHONHASHSEED unset", "block_size=16"); len(l) != 1 {
		t.Errorf("startup contract line for good: %q", lb.String())
	}

	toks := engineTokens(t, sharedPrefix)
	good.store(t, c, toks, 4)
	// drift publishes under sha256 (pickle): keys differ from the rule's sha256_cbor.
	pickle, err := hashcore.New(hashcore.Spec{Engine: "vllm", Algo: "sha256", BlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	drift.store(t, pickle, toks, 4)
	// big publishes 32-token blocks: a parity failure of its own kind; their token ids
	// re-hash into the rule's 16-token blocks (a multiple), so they stay keyable.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := big.pub.WaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	c32, _ := hashcore.New(hashcore.Spec{Engine: "vllm", Algo: "sha256_cbor", BlockSize: 32})
	big.pub.Publish(enginepub.BlockStored{Hashes: hashcore.Keys(c32, nil, toks[:64], nil), TokenIDs: toks[:64], BlockSize: 32})

	want := map[string]string{"good": "exact", "drift": "degraded(parity_mismatch)",
		"big": "degraded(block_size)", "lost": "degraded(events_not_connected)",
		"http": "degraded(events_not_connected)"}
	defer func() {
		if t.Failed() {
			t.Logf("inventory %+v\nlog:\n%s", inventoryStates(t, s), lb.String())
		}
	}()
	waitFor(t, "every endpoint in its state", func() bool {
		for name, w := range inventoryStates(t, s) {
			got := w.Routing
			if len(w.Reasons) > 0 {
				got += "(" + strings.Join(w.Reasons, ",") + ")"
			}
			if got != want[name] {
				return false
			}
		}
		return true
	})
	for _, name := range []string{"drift", "big", "lost"} {
		if l := lb.lines("level=WARN", "endpoint routing state changed", "endpoint="+name, "to="+want[name]); len(l) != 1 {
			t.Errorf("%s: want one WARN transition to %s, log:\n%s", name, want[name], lb.String())
		}
	}
	if l := lb.lines("level=WARN", "endpoint routing state changed", "endpoint=good"); len(l) != 0 {
		t.Errorf("good endpoint changed state: %q", l)
	}
	if w := inventoryStates(t, s)["lost"].Why; !strings.Contains(w, "cannot subscribe to tcp://") {
		t.Errorf("lost why: %q", w)
	}
	waitFor(t, "http's why naming the peer's protocol error", func() bool {
		return strings.Contains(inventoryStates(t, s)["http"].Why, "; last protocol error: ")
	})
	m := scrapeMetrics(t, s)
	for _, series := range []string{
		`kvgate_routing_state{endpoint="good",state="exact"}`,
		`kvgate_routing_state{endpoint="lost",state="degraded"}`,
		`kvgate_routing_degraded{endpoint="lost",reason="events_not_connected"}`,
		`kvgate_routing_degraded{endpoint="drift",reason="parity_mismatch"}`,
		`kvgate_routing_degraded{endpoint="big",reason="block_size"}`,
	} {
		if m[series] != 1 {
			t.Errorf("%s = %v, want 1", series, m[series])
		}
	}
	if m[`kvgate_routing_state{endpoint="good",state="degraded"}`] != 0 || m[`kvgate_routing_degraded{endpoint="good",reason="events_not_connected"}`] != 0 {
		t.Error("good endpoint has degraded series set")
	}
	res, err := httpc.Get(s.admURL("/readyz"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(body), "lost: events_not_connected") {
		t.Errorf("/readyz %d %q: want 200 naming the degraded endpoints", res.StatusCode, body)
	}
}

// kv-mode off: every endpoint is off, and stays so.
func TestRoutingStateOff(t *testing.T) {
	a := newFakeEngine(t, "a")
	s := startProxy(t, testConfig(a.url()))
	if st := inventoryStates(t, s)["e0"]; st.Routing != "off" || len(st.Reasons) != 0 {
		t.Errorf("kv off: %+v", st)
	}
	if m := scrapeMetrics(t, s); m[`kvgate_routing_state{endpoint="e0",state="off"}`] != 1 {
		t.Error("no off gauge")
	}
}

// The zero-hit watchdog: misses in a row while the inventory holds keys warn once per
// episode; a hit ends the episode, and a new run of misses warns again.
func TestZeroHitWatchdog(t *testing.T) {
	c := vllmChain(t)
	a := newKVEngine(t, "a", enginepub.VLLM)
	cfg := kvConfig(t, KVConverged, a.spec(0, "vllm", ""))
	cfg.KV.PendingTTL = 0 // repeats would follow their own pending entries (TestKVPendingEntries)
	s, lb := startLogged(t, cfg, func(s *Server) {
		fastStates(s)
		s.states.tun.zeroHitMisses = 5
		s.states.tun.populatedKeys = 4
	})
	a.store(t, c, engineTokens(t, sharedPrefix), 8)
	waitFor(t, "events applied", func() bool { return s.kv.inv.Count(0) == 8 })
	miss := func(n int) {
		for i := 0; i < n; i++ {
			if res, _ := post(t, s.url("/v1/completions"), complPrompt(uncachedPrompt)); res.Header.Get("x-kvgate-route") != "kv-miss:no_worker" {
				t.Fatalf("route %q, want kv-miss:no_worker", res.Header.Get("x-kvgate-route"))
			}
		}
	}
	const alarm = "a contract problem"
	miss(6)
	waitFor(t, "zero-hit warning", func() bool { return len(lb.lines("level=WARN", alarm)) == 1 })
	if scrapeMetrics(t, s)["kvgate_kv_zero_hit_alarm"] != 1 {
		t.Error("alarm gauge not set")
	}
	miss(6)
	time.Sleep(100 * time.Millisecond)
	if n := len(lb.lines("level=WARN", alarm)); n != 1 {
		t.Errorf("%d warnings in one episode, want 1", n)
	}
	if res, _ := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix)); res.Header.Get("x-kvgate-route") != "kv-hit" {
		t.Fatalf("route %q, want kv-hit", res.Header.Get("x-kvgate-route"))
	}
	waitFor(t, "episode over", func() bool { return len(lb.lines("zero-hit episode over")) == 1 })
	miss(6)
	waitFor(t, "second episode warned", func() bool { return len(lb.lines("level=WARN", alarm)) == 2 })
}

// The load scrape stays within scrapeBudget reads a second at any fleet size.
func TestScrapeIntervalBudget(t *testing.T) {
	for _, c := range []struct {
		every time.Duration
		n     int
		want  time.Duration
	}{
		{50 * time.Millisecond, 8, 50 * time.Millisecond},
		{50 * time.Millisecond, 64, 64 * time.Millisecond},
		{50 * time.Millisecond, 1024, 1024 * time.Millisecond},
		{2 * time.Second, 1024, 2 * time.Second},
	} {
		got := scrapeInterval(c.every, c.n)
		if got != c.want {
			t.Errorf("%v over %d endpoints: every %v, want %v", c.every, c.n, got, c.want)
		}
		if rate := float64(c.n) / got.Seconds(); rate > scrapeBudget+1e-9 {
			t.Errorf("%v over %d endpoints: %.0f reads/s", c.every, c.n, rate)
		}
	}
}

// The stale check counts only requests that should make the engine publish: a healthy
// engine that already holds every full block of what it is sent publishes nothing and
// stays exact however many such requests it serves; prompts with blocks it has not
// reported, sent without any event arriving, degrade it (stale) at WARN, and its next
// event batch makes it exact again.
func TestRoutingStateStale(t *testing.T) {
	a := newKVEngine(t, "a", enginepub.VLLM)
	s, lb := startHolding(t, kvConfig(t, KVConverged, a.spec(0, "vllm", "")), a)
	routing := func() string {
		st := inventoryStates(t, s)["a"]
		if len(st.Reasons) > 0 {
			return st.Routing + "(" + strings.Join(st.Reasons, ",") + ")"
		}
		return st.Routing
	}

	for i := 0; i < 20; i++ {
		if res, _ := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix)); res.Header.Get("x-kvgate-route") != "kv-hit" {
			t.Fatalf("route %q, want kv-hit", res.Header.Get("x-kvgate-route"))
		}
	}
	time.Sleep(10 * s.states.tun.every) // evaluations enough to see them
	if got := routing(); got != "exact" {
		t.Fatalf("after 20 requests it holds in full: %s, want exact", got)
	}

	for i := 0; i < 6; i++ {
		post(t, s.url("/v1/completions"), complPrompt(uncachedPrompt))
	}
	waitFor(t, "stale", func() bool { return routing() == "degraded(stale)" })
	if l := lb.lines("level=WARN", "endpoint routing state changed", "endpoint=a", "to=degraded(stale)",
		"prompts with blocks it has not reported"); len(l) != 1 {
		t.Errorf("want one WARN transition to stale")
	}
	if m := scrapeMetrics(t, s); m[`kvgate_routing_degraded{endpoint="a",reason="stale"}`] != 1 {
		t.Error("no stale series")
	}
	a.store(t, vllmChain(t), engineTokens(t, uncachedPrompt), 2)
	waitFor(t, "exact again after an event batch", func() bool { return routing() == "exact" })
}

// An engine whose event messages kvgate cannot decode (another wire format) still sends
// batches, so it never looks stale; its own reason shows it, with a WARN transition, on
// /debug/inventory and /metrics, and clears once the recent window passes without one.
func TestRoutingStateUnreadableEvents(t *testing.T) {
	a := newKVEngine(t, "a", enginepub.VLLM)
	s, lb := startHolding(t, kvConfig(t, KVConverged, a.spec(0, "vllm", "")), a, func(s *Server) { s.states.tun.recent = 500 * time.Millisecond })
	routing := func() string {
		st := inventoryStates(t, s)["a"]
		if len(st.Reasons) > 0 {
			return st.Routing + "(" + strings.Join(st.Reasons, ",") + ")"
		}
		return st.Routing
	}
	time.Sleep(10 * s.states.tun.every)
	if got := routing(); got != "exact" {
		t.Fatalf("before: %s, want exact", got)
	}
	if err := a.pub.PublishRaw([]byte("a format kvgate does not read")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "unreadable_events", func() bool { return routing() == "degraded(unreadable_events)" })
	if l := lb.lines("level=WARN", "endpoint routing state changed", "endpoint=a", "to=degraded(unreadable_events)",
		"did not decode"); len(l) != 1 {
		t.Errorf("want one WARN transition naming the reason, got %q", l)
	}
	if m := scrapeMetrics(t, s); m[`kvgate_routing_degraded{endpoint="a",reason="unreadable_events"}`] != 1 {
		t.Error("no unreadable_events series")
	}
	waitFor(t, "exact again once the window passed", func() bool { return routing() == "exact" })
}

// In -kv-mode 1 the prefill endpoint computes the blocks, so its leg counts toward its
// stale check: fully held prompts keep it exact, prompts with new blocks and no event
// make it stale. The decode endpoint is never scored and stays off.
func TestRoutingStateStalePD(t *testing.T) {
	p, dec := newKVEngine(t, "p1", enginepub.VLLM), newKVEngine(t, "d1", enginepub.VLLM)
	p.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"p","choices":[{"index":0,"text":"x","finish_reason":"length"}],"kv_transfer_params":`+vllmKTP+`}`)
		return true
	}
	s, _ := startHolding(t, kvConfig(t, KVDisaggregated, p.spec(0, "vllm", ",role=prefill"), dec.spec(1, "vllm", ",role=decode")), p)
	for i := 0; i < 20; i++ {
		if res, _ := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix)); res.Header.Get("x-kvgate-prefill") != "p1" || res.Header.Get("x-kvgate-route") != "kv-hit" {
			t.Fatalf("prefill %q route %q, want p1 kv-hit", res.Header.Get("x-kvgate-prefill"), res.Header.Get("x-kvgate-route"))
		}
	}
	time.Sleep(10 * s.states.tun.every)
	if st := inventoryStates(t, s); st["p1"].Routing != "exact" || st["d1"].Routing != "off" {
		t.Fatalf("after 20 requests p1 holds in full: %+v", st)
	}
	for i := 0; i < 6; i++ {
		if res, _ := post(t, s.url("/v1/completions"), complPrompt(uncachedPrompt)); res.Header.Get("x-kvgate-prefill") != "p1" {
			t.Fatalf("prefill %q, want p1", res.Header.Get("x-kvgate-prefill"))
		}
	}
	waitFor(t, "p1 stale", func() bool {
		st := inventoryStates(t, s)["p1"]
		return st.Routing == "degraded" && strings.Join(st.Reasons, ",") == "stale"
	})
	if st := inventoryStates(t, s)["d1"]; st.Routing != "off" {
		t.Errorf("decode endpoint: %+v", st)
	}
}

// uncachedPrompt is a prompt no test engine reports blocks of.
var uncachedPrompt = strings.Repeat("Completely different words that no engine has cached yet, friend. ", 8)

// startHolding starts a server over cfg whose stale check trips at 5 requests (tune may
// adjust more), with e (in slot 0) reporting every full block of sharedPrefix; the log is
// shown if the test fails.
func startHolding(t *testing.T, cfg Config, e *kvEngine, tune ...func(*Server)) (*Server, *logBuf) {
	t.Helper()
	s, lb := startLogged(t, cfg, func(s *Server) {
		fastStates(s)
		s.states.tun.staleRequests = 5
		for _, f := range tune {
			f(s) // before the watcher starts: it reads the tuning unlocked
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", lb.String())
		}
	})
	toks := engineTokens(t, sharedPrefix)
	full := len(toks) / blockSize
	e.store(t, vllmChain(t), toks, full)
	waitFor(t, "events applied", func() bool { return s.kv.inv.Count(0) == full })
	return s, lb
}

// sendsNewBlocks: a prompt expects stored blocks from where it goes unless that slot (or,
// with no rank named, one of the endpoint's ranks) reported all its full blocks, on any tier.
func TestSendsNewBlocks(t *testing.T) {
	specs := []EndpointSpec{{Name: "a"}, {Name: "b", DP: 3}}
	k := &kvRouter{ranks: newRankLayout(specs, true, false)}
	l := k.ranks
	st := newReqState(l.slots())
	st.reset()
	d := &decision{ep: 1, slot: -1}
	if k.sendsNewBlocks(st, d) {
		t.Error("a prompt without full blocks expects stores")
	}
	st.keys = append(st.keys, 1, 2, 3, 4)
	for _, c := range []struct {
		name       string
		ep, slot   int
		scores     map[int]int32 // slot -> reported blocks
		wantStores bool
	}{
		{"nothing held", 0, 0, nil, true},
		{"held in full", 0, 0, map[int]int32{0: 4}, false},
		{"held in part", 0, 0, map[int]int32{0: 3}, true},
		{"held in full on the CPU tier", 0, 0, map[int]int32{l.cpu: 4}, false},
		{"another endpoint holds it", 0, 0, map[int]int32{1: 4}, true},
		{"the named rank lacks it", 1, l.slot(1, 1), map[int]int32{l.slot(1, 2): 4}, true},
		{"the named rank holds it", 1, l.slot(1, 2), map[int]int32{l.slot(1, 2): 4}, false},
		{"no rank named, one holds it", 1, -1, map[int]int32{l.slot(1, 2): 4}, false},
		{"no rank named, one on its CPU tier", 1, -1, map[int]int32{l.cpu + l.slot(1, 1): 4}, false},
		{"no rank named, none in full", 1, -1, map[int]int32{1: 3, l.slot(1, 1): 2}, true},
	} {
		clear(st.scores)
		for s, n := range c.scores {
			st.scores[s] = n
		}
		if got := k.sendsNewBlocks(st, &decision{ep: c.ep, slot: c.slot}); got != c.wantStores {
			t.Errorf("%s: %v, want %v", c.name, got, c.wantStores)
		}
	}
	st.keys, st.fastKeys = st.keys[:0], append(st.fastKeys, 9, 9)
	st.scores[0] = 1
	if !k.sendsNewBlocks(st, &decision{ep: 0, slot: 0}) {
		t.Error("fast keys: 2 blocks, 1 held: want stores")
	}
}

// The stale check's count on the request path allocates nothing.
func TestNoteStoresAllocs(t *testing.T) {
	s, st, d := noteStoresFixture()
	if n := testing.AllocsPerRun(1000, func() { s.noteStores(st, d) }); n != 0 {
		t.Errorf("noteStores: %v allocs/op, want 0", n)
	}
	if got := s.states.eps[d.ep].sentNew.Load(); got != 1001 {
		t.Errorf("counted %d requests, want 1001 (each has blocks no rank reported)", got)
	}
}
