package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/hashcore"
	"github.com/kvgate/kvgate/internal/testfix"
	"github.com/kvgate/kvgate/proxy/openai"
	"github.com/kvgate/kvgate/proxy/route"
	"github.com/kvgate/kvgate/shard"
	"github.com/kvgate/kvgate/tokenize"
)

// qwen3Dir is the fetched Qwen3 tokenizer directory; missing files fail the test.
func qwen3Dir(t testing.TB) string {
	t.Helper()
	return testfix.TokenizerDir(t, "qwen3")
}

var (
	poolOnce sync.Once
	pool     *tokenize.Pool
	poolErr  error
)

// sharedPool loads the Qwen3 tokenizer once for every test server.
func sharedPool(t testing.TB) *tokenize.Pool {
	t.Helper()
	poolOnce.Do(func() {
		pool = tokenize.NewPool()
		poolErr = pool.Add("qwen3", qwen3Dir(t), "Qwen/Qwen3-0.6B")
	})
	if poolErr != nil {
		t.Fatal(poolErr)
	}
	return pool
}

// engineTokens tokenizes as the engine does (the tokenize package is checked against
// the HF tokenizers library by its own goldens).
func engineTokens(t testing.TB, prompt string) []uint32 {
	toks, err := sharedPool(t).Get("qwen3").EncodePrompt(nil, prompt)
	if err != nil {
		t.Fatal(err)
	}
	return toks
}

// kvEngine is a fake engine HTTP server plus its real ZeroMQ KV event publisher.
type kvEngine struct {
	*fakeEngine
	pub *enginepub.Publisher
}

func newKVEngine(t *testing.T, name string, flavor enginepub.Flavor) *kvEngine {
	p, err := enginepub.New(enginepub.Config{Endpoint: "tcp://127.0.0.1:0", Format: enginepub.Format{Flavor: flavor}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &kvEngine{fakeEngine: newFakeEngine(t, name), pub: p}
}

func (e *kvEngine) spec(i int, engine, extra string) string {
	return fmt.Sprintf("name=%s,url=%s,engine=%s,events=%s%s", e.name, e.url(), engine, e.pub.Addr(), extra)
}

const blockSize = 16

// vllmChain is the contract the fake vLLM engines publish under (sha256_cbor, seed unset).
func vllmChain(t testing.TB) hashcore.Chain {
	c, err := hashcore.New(hashcore.Spec{Engine: "vllm", Algo: "sha256_cbor", BlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// store publishes BlockStored for the first n full blocks of toks, as vLLM would.
func (e *kvEngine) store(t *testing.T, c hashcore.Chain, toks []uint32, n int) {
	keys := hashcore.Keys(c, nil, toks[:n*blockSize], nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.pub.WaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.pub.Publish(enginepub.BlockStored{Hashes: keys, TokenIDs: toks[:n*blockSize], BlockSize: blockSize}); err != nil {
		t.Fatal(err)
	}
}

func kvConfig(t *testing.T, mode KVMode, specs ...string) Config {
	cfg := Defaults()
	cfg.Health.Interval = 0
	cfg.Shutdown.Grace = 5 * time.Second
	cfg.Upstream.ConnectTimeout = time.Second
	cfg.KV.Mode = mode
	cfg.KV.BlockSize = blockSize
	cfg.KV.HashAlgo = "sha256_cbor"
	cfg.Models.Tokenizers = []TokenizerSpec{{Model: "qwen3", Dir: qwen3Dir(t), Aliases: []string{"Qwen/Qwen3-0.6B"}}}
	cfg.Models.LoRA = map[string]string{"qwen3-sql-lora": "qwen3"}
	for _, s := range specs {
		sp, err := ParseEndpoint(s)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Fleet.Endpoints = append(cfg.Fleet.Endpoints, sp)
	}
	return cfg
}

var sharedPrefix = strings.Repeat("The quick brown fox jumps over the lazy dog near the river bank. ", 12)

func complPrompt(prompt string) string {
	b, _ := json.Marshal(map[string]any{"model": "qwen3", "prompt": prompt, "max_tokens": 8})
	return string(b)
}

// A shared prefix lands on the endpoint holding its blocks; misses say why; after a
// connect failure the next-best overlap wins.
func TestKVExactMode3(t *testing.T) {
	c := vllmChain(t)
	a, b, d := newKVEngine(t, "a", enginepub.VLLM), newKVEngine(t, "b", enginepub.VLLM), newKVEngine(t, "c", enginepub.VLLM)
	cfg := kvConfig(t, KVConverged, a.spec(0, "vllm", ""), b.spec(1, "vllm", ""), d.spec(2, "vllm", ""))
	s := startProxy(t, cfg)

	toks := engineTokens(t, sharedPrefix)
	if len(toks) < 8*blockSize {
		t.Fatalf("prefix has only %d tokens", len(toks))
	}
	b.store(t, c, toks, 8) // b holds 8 blocks of the prefix
	d.store(t, c, toks, 3) // c holds 3
	waitFor(t, "events applied", func() bool { return s.kv.inv.Count(1) == 8 && s.kv.inv.Count(2) == 3 })

	res, body := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix+"What is next?"))
	if res.StatusCode != 200 || res.Header.Get("x-kvgate-endpoint") != "b" || res.Header.Get("x-kvgate-route") != "kv-hit" {
		t.Fatalf("shared prefix: %d endpoint=%s route=%s %s", res.StatusCode, res.Header.Get("x-kvgate-endpoint"), res.Header.Get("x-kvgate-route"), body)
	}
	// The receipt: engine said 32 cached tokens, kvgate predicted 8 blocks x 16.
	if s.m.delivered[1].Get() != 32 || s.m.predicted[1].Get() != 8*blockSize || s.m.hits[1].Get() != 1 {
		t.Errorf("receipt delivered=%d predicted=%d hits=%d", s.m.delivered[1].Get(), s.m.predicted[1].Get(), s.m.hits[1].Get())
	}

	for _, tc := range []struct{ body, route string }{
		{complPrompt("Completely unrelated text about astronomy and the orbits of distant planets, " + strings.Repeat("stars ", 40)), "kv-miss:no_worker"},
		{`{"model":"nope","prompt":"` + sharedPrefix + `"}`, "kv-miss:model_unknown"},
		{`{"model":"qwen3","prompt":""}`, "kv-miss:text_empty"},
		{`{"model":"qwen3","prompt":"short"}`, "kv-miss:no_blocks"},
		{`{"model":"qwen3","prompt":[1,-5]}`, "kv-miss:tokenize"},
	} {
		res, body := post(t, s.url("/v1/completions"), tc.body)
		if res.StatusCode != 200 || res.Header.Get("x-kvgate-route") != tc.route {
			t.Errorf("%.40s: %d route=%q want %q (%s)", tc.body, res.StatusCode, res.Header.Get("x-kvgate-route"), tc.route, body)
		}
	}
	// Alias and token-id prompts reach the same blocks.
	ids, _ := json.Marshal(toks)
	res, _ = post(t, s.url("/v1/completions"), `{"model":"Qwen/Qwen3-0.6B","prompt":`+string(ids)+`}`)
	if res.Header.Get("x-kvgate-endpoint") != "b" || res.Header.Get("x-kvgate-route") != "kv-hit" {
		t.Errorf("token-id prompt: %s %s", res.Header.Get("x-kvgate-endpoint"), res.Header.Get("x-kvgate-route"))
	}
	// A LoRA adapter's blocks carry its name: the base model's blocks do not match.
	res, _ = post(t, s.url("/v1/completions"), `{"model":"qwen3-sql-lora","prompt":`+string(ids)+`}`)
	if res.Header.Get("x-kvgate-route") != "kv-miss:no_worker" {
		t.Errorf("lora: %s", res.Header.Get("x-kvgate-route"))
	}

	// /debug/explain shows the scores and sends nothing.
	// (Counted by path: the load scraper reads /metrics meanwhile.)
	before := b.count("/v1/completions")
	res, body = post(t, s.admURL("/debug/explain"), complPrompt(sharedPrefix))
	var ex Explanation
	if err := json.Unmarshal([]byte(body), &ex); err != nil {
		t.Fatal(err, body)
	}
	if ex.Endpoint != "b" || ex.Route != "kv-hit" || ex.Scores["b"] != 8 || ex.Scores["c"] != 3 || ex.Scores["a"] != 0 || ex.Tokens != len(toks) || ex.Blocks != len(toks)/blockSize {
		t.Errorf("explain %+v (tokens %d)", ex, len(toks))
	}
	if b.count("/v1/completions") != before {
		t.Error("explain reached an engine")
	}
	// /debug/inventory: keys, parity (attested from token_ids), connection.
	r, err := httpc.Get(s.admURL("/debug/inventory"))
	if err != nil {
		t.Fatal(err)
	}
	var inv struct {
		Endpoints []struct {
			Name      string
			Keys      int
			Parity    string
			Connected bool
			LastSeq   int64 `json:"last_seq"`
		}
	}
	json.NewDecoder(r.Body).Decode(&inv)
	r.Body.Close()
	if len(inv.Endpoints) != 3 || inv.Endpoints[1].Keys != 8 || inv.Endpoints[1].Parity != "ok" || !inv.Endpoints[1].Connected || inv.Endpoints[1].LastSeq != 0 {
		t.Errorf("inventory %+v", inv)
	}
	// Admin-down on the winner: the next-best overlap serves and its blocks still count.
	post(t, s.admURL("/admin/endpoints/b/down"), "")
	res, _ = post(t, s.url("/v1/completions"), complPrompt(sharedPrefix))
	if res.Header.Get("x-kvgate-endpoint") != "c" || res.Header.Get("x-kvgate-route") != "kv-hit" {
		t.Errorf("b down: %s %s", res.Header.Get("x-kvgate-endpoint"), res.Header.Get("x-kvgate-route"))
	}
	post(t, s.admURL("/admin/endpoints/b/up"), "")
	// Shallow: demand more matched tokens than c holds once b is unreachable.
	_ = d
}

// The endpoint holding the blocks refuses connections: the request is retried on the
// next-best overlap without the client seeing an error.
func TestKVNextBestAfterConnectFailure(t *testing.T) {
	c := vllmChain(t)
	a, b, d := newKVEngine(t, "a", enginepub.VLLM), newKVEngine(t, "b", enginepub.VLLM), newKVEngine(t, "c", enginepub.VLLM)
	dead := "http://" + deadAddr(t)
	specB := fmt.Sprintf("name=b,url=%s,engine=vllm,events=%s", dead, b.pub.Addr())
	cfg := kvConfig(t, KVConverged, a.spec(0, "vllm", ""), specB, d.spec(2, "vllm", ""))
	cfg.KV.MinMatchTokens = 2 * blockSize
	s := startProxy(t, cfg)
	toks := engineTokens(t, sharedPrefix)
	b.store(t, c, toks, 6)
	d.store(t, c, toks, 4)
	a.store(t, c, toks, 1)
	waitFor(t, "events applied", func() bool {
		return s.kv.inv.Count(0) == 1 && s.kv.inv.Count(1) == 6 && s.kv.inv.Count(2) == 4
	})
	res, body := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix))
	if res.StatusCode != 200 || res.Header.Get("x-kvgate-endpoint") != "c" || res.Header.Get("x-kvgate-route") != "kv-hit" {
		t.Fatalf("%d %s %s %s", res.StatusCode, res.Header.Get("x-kvgate-endpoint"), res.Header.Get("x-kvgate-route"), body)
	}
	if s.m.retries.Get() != 1 || s.m.upstream[ErrConnect][1].Get() != 1 {
		t.Errorf("retries=%d connect failures=%d", s.m.retries.Get(), s.m.upstream[ErrConnect][1].Get())
	}
	// With c drained too, a (1 block) is below -kv-min-match-tokens: shallow, then rr.
	post(t, s.admURL("/admin/endpoints/c/down"), "")
	res, _ = post(t, s.url("/v1/completions"), complPrompt(sharedPrefix))
	if res.StatusCode != 200 || res.Header.Get("x-kvgate-route") != "kv-miss:shallow" {
		t.Errorf("shallow: %d %s", res.StatusCode, res.Header.Get("x-kvgate-route"))
	}
}

// A KV-Exact winner over its load bound yields to the next-best overlap.
func TestKVLoadBound(t *testing.T) {
	c := vllmChain(t)
	a, b := newKVEngine(t, "a", enginepub.VLLM), newKVEngine(t, "b", enginepub.VLLM)
	cfg := kvConfig(t, KVConverged, a.spec(0, "vllm", ""), b.spec(1, "vllm", ""))
	cfg.KV.LoadFactor = 0
	cfg.KV.Policy = "overlap"
	s := startProxy(t, cfg)
	toks := engineTokens(t, sharedPrefix)
	a.store(t, c, toks, 6)
	b.store(t, c, toks, 2)
	waitFor(t, "events", func() bool { return s.kv.inv.Count(0) == 6 && s.kv.inv.Count(1) == 2 })
	// Three requests already in flight on a: bound = ceil(1 x (3+1)/2) = 2 < 4.
	for i := 0; i < 3; i++ {
		s.loads.Inc(0)
	}
	defer func() {
		for i := 0; i < 3; i++ {
			s.loads.Dec(0)
		}
	}()
	res, _ := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix))
	if res.Header.Get("x-kvgate-endpoint") != "b" || res.Header.Get("x-kvgate-route") != "kv-hit" || s.m.nextBest.Get() != 1 {
		t.Errorf("%s %s next-best=%d", res.Header.Get("x-kvgate-endpoint"), res.Header.Get("x-kvgate-route"), s.m.nextBest.Get())
	}
}

// The cost policy: the deeper holder wins while its queue is empty; once the prefill
// queued there costs more than the uncached tokens elsewhere, the shallower holder
// (or an endpoint holding nothing: kv-spread) takes the request, and /debug/explain
// shows each endpoint's terms from the same decision.
func TestKVCostPolicy(t *testing.T) {
	c := vllmChain(t)
	a, b, e := newKVEngine(t, "a", enginepub.VLLM), newKVEngine(t, "b", enginepub.VLLM), newKVEngine(t, "e", enginepub.VLLM)
	cfg := kvConfig(t, KVConverged, a.spec(0, "vllm", ""), b.spec(1, "vllm", ""), e.spec(2, "vllm", ""))
	cfg.KV.PrefillRate = 10000
	cfg.KV.PendingTTL = 0 // e would then hold what kvgate sent it (TestKVPendingEntries)
	s := startProxy(t, cfg)
	toks := engineTokens(t, sharedPrefix)
	a.store(t, c, toks, 6)
	b.store(t, c, toks, 2)
	waitFor(t, "events", func() bool { return s.kv.inv.Count(0) == 6 && s.kv.inv.Count(1) == 2 })
	res, _ := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix))
	if res.Header.Get("x-kvgate-endpoint") != "a" || res.Header.Get("x-kvgate-route") != "kv-hit" {
		t.Fatalf("idle: %s %s", res.Header.Get("x-kvgate-endpoint"), res.Header.Get("x-kvgate-route"))
	}
	// 50,000 tokens (5 s) queued at a: b's 4 extra uncached blocks cost 6.4 ms.
	s.queues.Sent(0, 50000)
	res, _ = post(t, s.url("/v1/completions"), complPrompt(sharedPrefix))
	if res.Header.Get("x-kvgate-endpoint") != "b" || res.Header.Get("x-kvgate-route") != "kv-hit" {
		t.Fatalf("a queued: %s %s", res.Header.Get("x-kvgate-endpoint"), res.Header.Get("x-kvgate-route"))
	}
	s.queues.Sent(1, 50000)
	res, _ = post(t, s.url("/v1/completions"), complPrompt(sharedPrefix))
	if res.Header.Get("x-kvgate-endpoint") != "e" || res.Header.Get("x-kvgate-route") != "kv-spread" {
		t.Fatalf("a and b queued: %s %s", res.Header.Get("x-kvgate-endpoint"), res.Header.Get("x-kvgate-route"))
	}
	res, body := post(t, s.admURL("/debug/explain"), complPrompt(sharedPrefix))
	var ex Explanation
	if err := json.Unmarshal([]byte(body), &ex); err != nil || res.StatusCode != 200 {
		t.Fatalf("%d %v %s", res.StatusCode, err, body)
	}
	if ex.Policy != "cost" || ex.Endpoint != "e" || ex.Route != "kv-spread" || len(ex.Terms) != 3 ||
		ex.Terms["a"].Queued != 50000 || ex.Terms["a"].Matched != 6 || ex.Terms["e"].Uncached != len(toks) ||
		ex.Terms["e"].Predicted >= ex.Terms["b"].Predicted || ex.Terms["b"].Rate != 10000 {
		t.Fatalf("explain %s", body)
	}
	if got := s.m.misses[RouteMissNoWorker].Get(); got != 0 {
		t.Errorf("explain or spread counted as misses: %d", got)
	}
}

// Engine load reports: kvgate reads each engine's /metrics (vLLM's gauges), a holder
// whose engine reports a long waiting queue loses to a shallower holder, and an engine
// whose /metrics is garbage keeps being routed on kvgate's own accounting, shown per
// endpoint on /debug/inventory.
func TestKVCostEngineReports(t *testing.T) {
	c := vllmChain(t)
	a, b := newKVEngine(t, "a", enginepub.VLLM), newKVEngine(t, "b", enginepub.VLLM)
	var running, waiting atomic.Int64
	running.Store(4)
	waiting.Store(20)
	a.handle = func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		if r.URL.Path != "/metrics" {
			return false
		}
		fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} %d\n"+
			"vllm:num_requests_waiting{model_name=\"m\"} %d\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.9\n", running.Load(), waiting.Load())
		return true
	}
	b.handle = func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		if r.URL.Path != "/metrics" {
			return false
		}
		io.WriteString(w, "<html>not metrics</html>")
		return true
	}
	cfg := kvConfig(t, KVConverged, a.spec(0, "vllm", ""), b.spec(1, "vllm", ""))
	cfg.KV.PrefillRate = 10000
	cfg.KV.LoadScrape = 20 * time.Millisecond
	cfg.KV.PendingTTL = 0 // b would keep the blocks kvgate sent it (TestKVPendingEntries)
	s := startProxy(t, cfg)
	toks := engineTokens(t, sharedPrefix)
	a.store(t, c, toks, 6)
	b.store(t, c, toks, 2)
	waitFor(t, "events", func() bool { return s.kv.inv.Count(0) == 6 && s.kv.inv.Count(1) == 2 })
	waitFor(t, "scrapes", func() bool {
		return s.roster().eps[0].scrape.ok.Load() > 0 && s.roster().eps[1].scrape.failed.Load() > 0
	})
	s.queues.Finished(0, route.Ticket{}, time.Second, 0, false) // a request holds a for 1 s: 21 ahead over 4 slots wait ~5 s
	res, _ := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix))
	if res.Header.Get("x-kvgate-endpoint") != "b" || res.Header.Get("x-kvgate-route") != "kv-hit" {
		t.Fatalf("a's engine reports 20 waiting: %s %s", res.Header.Get("x-kvgate-endpoint"), res.Header.Get("x-kvgate-route"))
	}
	running.Store(1) // a slot is free: no wait ahead
	waiting.Store(0)
	waitFor(t, "queue drained", func() bool {
		res, _ := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix))
		return res.Header.Get("x-kvgate-endpoint") == "a"
	})
	_, body := get(t, s.admURL("/debug/inventory"))
	var inv struct {
		Endpoints []inventoryEndpoint `json:"endpoints"`
	}
	if err := json.Unmarshal([]byte(body), &inv); err != nil {
		t.Fatal(err)
	}
	ea, eb := inv.Endpoints[0], inv.Endpoints[1]
	if ea.Load == nil || !ea.Load.Engine.Fresh || ea.Load.Engine.Running != 1 || ea.Load.Engine.KVUsage != 0.9 || ea.Load.Slots != 4 || ea.Scrape.Failing {
		t.Errorf("a: %s", body)
	}
	if eb.Scrape == nil || !eb.Scrape.Failing || eb.Scrape.LastError == "" || eb.Load.Engine.Fresh {
		t.Errorf("b: %s", body)
	}
}

func get(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

// Two kvgate replicas in front of the same engines see the same engine-reported load, so
// they make the same choice without sharing any state: both move off the engine whose
// queue grows, and both come back once it drains.
func TestKVCostReplicasAgree(t *testing.T) {
	c := vllmChain(t)
	a, b := newKVEngine(t, "a", enginepub.VLLM), newKVEngine(t, "b", enginepub.VLLM)
	var waiting atomic.Int64
	metricsFor := func(run func() int64) func(http.ResponseWriter, *http.Request, []byte) bool {
		return func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
			if r.URL.Path != "/metrics" {
				return false
			}
			fmt.Fprintf(w, "vllm:num_requests_running{model_name=\"m\"} %d\nvllm:num_requests_waiting{model_name=\"m\"} %d\n", run(), waiting.Load())
			return true
		}
	}
	a.handle = metricsFor(func() int64 {
		if waiting.Load() > 0 {
			return 8
		}
		return 1
	})
	b.handle = metricsFor(func() int64 { return 1 })
	var replicas []*Server
	for i := 0; i < 2; i++ {
		cfg := kvConfig(t, KVConverged, a.spec(0, "vllm", ""), b.spec(1, "vllm", ""))
		cfg.KV.PrefillRate = 10000
		cfg.KV.LoadScrape = 20 * time.Millisecond
		replicas = append(replicas, startProxy(t, cfg))
	}
	toks := engineTokens(t, sharedPrefix)
	// store waits for one subscriber: both replicas must follow both engines first, or
	// the later one never sees the events (ZeroMQ drops what a PUB sends before).
	for _, s := range replicas {
		waitFor(t, "subscribed", func() bool { return s.kv.mgr.Status(0).Connected && s.kv.mgr.Status(1).Connected })
	}
	time.Sleep(100 * time.Millisecond) // the subscriptions reach the PUB sockets
	a.store(t, c, toks, 6)
	b.store(t, c, toks, 2)
	for _, s := range replicas {
		waitFor(t, "events", func() bool { return s.kv.inv.Count(0) == 6 && s.kv.inv.Count(1) == 2 })
		s.queues.Finished(0, route.Ticket{}, time.Second, 0, false)
	}
	choices := func() string {
		var out string
		for _, s := range replicas {
			res, _ := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix))
			out += res.Header.Get("x-kvgate-endpoint")
		}
		return out
	}
	waitFor(t, "both on the deeper holder", func() bool { return choices() == "aa" })
	waiting.Store(30) // another client's burst queues on a
	waitFor(t, "both move to b", func() bool { return choices() == "bb" })
	waiting.Store(0)
	waitFor(t, "both back on a", func() bool { return choices() == "aa" })
}

// Mode 3's pending entries: a prompt no engine has reported yet goes by -select, and a
// request sharing it follows it there (route prefix-trie) until the engine's events take
// over, for one to two -kv-pending-ttl; /debug/explain records nothing.
func TestKVPendingEntries(t *testing.T) {
	a, b, e := newKVEngine(t, "a", enginepub.VLLM), newKVEngine(t, "b", enginepub.VLLM), newKVEngine(t, "e", enginepub.VLLM)
	cfg := kvConfig(t, KVConverged, a.spec(0, "vllm", ""), b.spec(1, "vllm", ""), e.spec(2, "vllm", ""))
	cfg.KV.PendingTTL = 300 * time.Millisecond
	s := startProxy(t, cfg)
	res, _ := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix))
	first := res.Header.Get("x-kvgate-endpoint")
	if res.Header.Get("x-kvgate-route") != "kv-miss:no_worker" {
		t.Fatalf("first: %s", res.Header.Get("x-kvgate-route"))
	}
	// /debug/explain runs the same decision but remembers nothing.
	for i := 0; i < 3; i++ {
		post(t, s.admURL("/debug/explain"), complPrompt(sharedPrefix+" other"))
	}
	for i := 0; i < 4; i++ {
		res, _ = post(t, s.url("/v1/completions"), complPrompt(sharedPrefix))
		if res.Header.Get("x-kvgate-endpoint") != first || res.Header.Get("x-kvgate-route") != "prefix-trie" {
			t.Fatalf("follow-up %d: %s %s, want %s prefix-trie", i, res.Header.Get("x-kvgate-endpoint"), res.Header.Get("x-kvgate-route"), first)
		}
	}
	if keys, _ := s.kv.trie.stats(); keys == 0 {
		t.Fatal("no pending keys")
	}
	// Unused for two TTLs, the entries are gone.
	time.Sleep(650 * time.Millisecond)
	post(t, s.admURL("/debug/explain"), complPrompt(sharedPrefix)) // explain turns no generation either
	res, _ = post(t, s.url("/v1/completions"), complPrompt("an unrelated prompt of its own, long enough for a block or two of tokens at least"))
	time.Sleep(10 * time.Millisecond)
	res, _ = post(t, s.url("/v1/completions"), complPrompt(sharedPrefix))
	if r := res.Header.Get("x-kvgate-route"); r != "kv-miss:no_worker" {
		t.Fatalf("after two TTLs: %s", r)
	}
}

// POST /v1/responses is keyed as the conversation vLLM renders from it: the first goes
// by -select, a second with the same conversation follows its pending entries.
func TestResponsesRouted(t *testing.T) {
	a, b := newKVEngine(t, "a", enginepub.VLLM), newKVEngine(t, "b", enginepub.VLLM)
	cfg := kvConfig(t, KVConverged, a.spec(0, "vllm", ""), b.spec(1, "vllm", ""))
	s := startProxy(t, cfg)
	body := `{"model":"qwen3","instructions":"You are a careful assistant who answers in short sentences and cites sources.","input":"` + sharedPrefix + `"}`
	res, _ := post(t, s.url("/v1/responses"), body)
	first := res.Header.Get("x-kvgate-endpoint")
	if res.Header.Get("x-kvgate-route") != "kv-miss:no_worker" || first == "" {
		t.Fatalf("first: %q %q", first, res.Header.Get("x-kvgate-route"))
	}
	res, _ = post(t, s.url("/v1/responses"), body)
	if res.Header.Get("x-kvgate-endpoint") != first || res.Header.Get("x-kvgate-route") != "prefix-trie" {
		t.Fatalf("second: %s %s", res.Header.Get("x-kvgate-endpoint"), res.Header.Get("x-kvgate-route"))
	}
	if n := a.count("/v1/responses") + b.count("/v1/responses"); n != 2 {
		t.Fatalf("engines saw %d /v1/responses requests", n)
	}
}

// The pending entries hold a prompt by the rule's engine keys when every eligible endpoint
// is keyed by them (the keys KV-Exact computed anyway), by kvgate's fast keys when the
// endpoints are re-hashed; either way a repeat of the prompt finds them.
func TestPendingKeySpace(t *testing.T) {
	for _, keys := range []string{"auto", "rehash"} {
		t.Run("keys="+keys, func(t *testing.T) {
			s, st := benchServerWith(t, chatBody4k(), func(cfg *Config) { cfg.KV.Keys = keys })
			st.body = append(st.body[:0], complPrompt(sharedPrefix)...)
			st.chat = false
			var d decision
			route := func() {
				if err := openai.Scan(st.body, &st.oa); err != nil {
					t.Fatal(err)
				}
				clear(st.excluded)
				s.decide(st, &d, false)
			}
			route()
			first := d.slot
			toks := engineTokens(t, sharedPrefix)
			engine, fast := hashcore.Keys(s.kv.chain, nil, toks, nil), hashcore.Keys(s.kv.fast, nil, toks, nil)
			want, other := engine, fast
			if keys == "rehash" {
				want, other = fast, engine
			}
			cur, _ := s.kv.trie.live()
			scores := make([]int32, len(st.scores))
			el := shard.NewMask(len(scores))
			el.SetAll(len(scores))
			if cur.Score(want, el, shard.Prefix, scores); int(scores[first]) != len(want) {
				t.Fatalf("pending entries hold %d of the prompt's %d keys at slot %d", scores[first], len(want), first)
			}
			if cur.Score(other, el, shard.Prefix, scores); scores[first] != 0 {
				t.Fatalf("pending entries hold the other chain's keys too (%d)", scores[first])
			}
			route()
			if d.slot != first || d.route != RoutePrefixTrie {
				t.Fatalf("repeat: slot %d route %v, want %d prefix-trie", d.slot, d.route, first)
			}
		})
	}
}
