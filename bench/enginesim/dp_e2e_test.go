package enginesim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/hashcore"
	"github.com/kvgate/kvgate/proxy"
)

// consecutivePorts is tcp://127.0.0.1:p with p..p+n-1 free (rank r publishes on p+r).
func consecutivePorts(t *testing.T, n int) string {
	t.Helper()
	for try := 0; try < 50; try++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		ok := true
		for r := 1; r < n && ok; r++ {
			l2, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port+r))
			if ok = err == nil; ok {
				l2.Close()
			}
		}
		if ok {
			return fmt.Sprintf("tcp://127.0.0.1:%d", port)
		}
	}
	t.Fatal("no run of free ports")
	return ""
}

type dpRig struct {
	d        *DP
	url, adm string // kvgate's public and admin base URLs
	enc      Encoder
	chain    hashcore.Chain
}

// startDP runs a two-core data-parallel engine sim (small KV pools: a few prompts evict
// older ones) behind kvgate declaring it dp=2.
func startDP(t *testing.T, engine string) *dpRig {
	t.Helper()
	sp := pdSpec(t, engine, "", "e")
	sp.Events, sp.NumBlocks = consecutivePorts(t, 2), 40
	d, err := LaunchDP(sp, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	ep, err := proxy.ParseEndpoint(fmt.Sprintf("name=e,url=%s,engine=%s,events=%s,dp=2", d.URL(), engine, sp.Events))
	if err != nil {
		t.Fatal(err)
	}
	cfg, pool := kvRule(t, proxy.KVConverged, EngineVLLM)
	cfg.KV.LoadScrape = 20 * time.Millisecond
	cfg.Fleet.Endpoints = []proxy.EndpointSpec{ep}
	pubURL, admURL := startProxy(t, cfg, pool)
	for _, s := range d.Ranks {
		if err := s.WaitSubscribed(context.Background(), 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return &dpRig{d: d, url: pubURL, adm: admURL,
		enc: sp.Encoder, chain: d.Ranks[0].Config().Chain}
}

// prompt is a completion prompt of about 100 tokens (6 full blocks) starting with tag.
func dpPrompt(tag string) string {
	return tag + " " + strings.Repeat("the quick brown fox jumps over the lazy dog while "+tag+" watches; ", 8)
}

// send posts a completion, to the sim's front directly with a rank header (rank >= 0) or
// through kvgate (rank < 0), and returns the rank that served it and kvgate's route.
func (g *dpRig) send(t *testing.T, prompt string, rank int) (served, route string) {
	t.Helper()
	base := g.url
	if rank >= 0 {
		base = g.d.URL()
	}
	body := fmt.Sprintf(`{"model":"qwen3","prompt":%q,"max_tokens":2}`, prompt)
	req, _ := http.NewRequest("POST", base+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if rank >= 0 {
		req.Header.Set(RankHeader, fmt.Sprint(rank))
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, b)
	}
	return res.Header.Get(ServedRankHeader), res.Header.Get("X-Kvgate-Route")
}

// rankKeys reads /debug/inventory's per-rank key counts of the one endpoint.
func (g *dpRig) rankKeys(t *testing.T) []int {
	t.Helper()
	res, err := http.Get(g.adm + "/debug/inventory")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var inv struct {
		Endpoints []struct {
			Keys  int `json:"keys"`
			Ranks []struct {
				Rank int `json:"rank"`
				Keys int `json:"keys"`
			} `json:"ranks"`
		} `json:"endpoints"`
	}
	if err := json.NewDecoder(res.Body).Decode(&inv); err != nil || len(inv.Endpoints) != 1 {
		t.Fatalf("inventory: %v", err)
	}
	var out []int
	for _, r := range inv.Endpoints[0].Ranks {
		out = append(out, r.Keys)
	}
	return out
}

// ranksReportFresh says whether /debug/inventory shows a fresh engine report for every
// rank of the endpoint (any: for some rank).
func (g *dpRig) ranksReportFresh(t *testing.T, anyRank bool) bool {
	t.Helper()
	res, err := http.Get(g.adm + "/debug/inventory")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var inv struct {
		Endpoints []struct {
			Ranks []struct {
				Load struct {
					Engine struct {
						Fresh bool `json:"fresh"`
					} `json:"engine_report"`
				} `json:"load"`
			} `json:"ranks"`
		} `json:"endpoints"`
	}
	if err := json.NewDecoder(res.Body).Decode(&inv); err != nil || len(inv.Endpoints) != 1 || len(inv.Endpoints[0].Ranks) != 2 {
		t.Fatalf("inventory: %v", err)
	}
	for _, r := range inv.Endpoints[0].Ranks {
		if r.Load.Engine.Fresh == anyRank {
			return anyRank
		}
	}
	return !anyRank
}

func (g *dpRig) waitKeys(t *testing.T, what string, ok func(k []int) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var k []int
	for time.Now().Before(deadline) {
		if k = g.rankKeys(t); len(k) == 2 && ok(k) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: per-rank keys %v", what, k)
}

// keys are the engine's block keys of a prompt.
func (g *dpRig) keys(t *testing.T, prompt string) []uint64 {
	t.Helper()
	toks, err := g.enc.EncodePrompt(nil, prompt)
	if err != nil {
		t.Fatal(err)
	}
	return hashcore.Keys(g.chain, nil, toks, nil)
}

// TestDataParallelRanksEndToEnd: a data-parallel vLLM (two cores, one API server, events
// on port+rank) behind kvgate, over real ZeroMQ and HTTP. kvgate keeps each rank's keys
// apart, routes a prompt to the rank that holds its prefix and says so in
// X-Data-Parallel-Rank (the sim serves the rank the header names), an eviction on rank 0
// leaves rank 1's copy routable, and a restart of rank 1 clears only rank 1.
//
// vLLM's /metrics gives each rank's load (engine="r"); SGLang's here sums the cores, so
// its ranks' loads stay kvgate's own accounting.
func TestDataParallelRanksEndToEnd(t *testing.T) {
	for _, engine := range []string{EngineVLLM, EngineSGLang} {
		t.Run(engine, func(t *testing.T) { testDataParallelRanks(t, engine) })
	}
}

func testDataParallelRanks(t *testing.T, engine string) {
	g := startDP(t, engine)
	a, b := dpPrompt("alpha"), dpPrompt("bravo")
	nA := len(g.keys(t, a))

	// Prime A on rank 1 only: kvgate sees it there, not on rank 0.
	if got, _ := g.send(t, a, 1); got != "1" {
		t.Fatalf("front served rank %s, want the header's 1", got)
	}
	g.waitKeys(t, "A on rank 1", func(k []int) bool { return k[0] == 0 && k[1] == nA })
	for i := 0; i < 4; i++ {
		if served, route := g.send(t, a, -1); served != "1" || route != "kv-hit" {
			t.Fatalf("follow-up %d of A: served by rank %s, route %s; want rank 1, kv-hit", i, served, route)
		}
	}

	// vLLM: each rank's load comes from its own engine="r" gauges on the front's /metrics.
	deadline := time.Now().Add(10 * time.Second)
	for engine == EngineVLLM && !g.ranksReportFresh(t, false) {
		if time.Now().After(deadline) {
			t.Fatal("no fresh per-rank engine report on /debug/inventory")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if engine == EngineSGLang {
		time.Sleep(100 * time.Millisecond) // scrapes every 20 ms: a summed report must not reach a rank
		if g.ranksReportFresh(t, true) {
			t.Fatal("a rank took the endpoint's summed SGLang report as its own")
		}
	}

	// /debug/explain names the rank and scores each.
	res, err := http.Post(g.adm+"/debug/explain", "application/json",
		strings.NewReader(fmt.Sprintf(`{"model":"qwen3","prompt":%q}`, a)))
	if err != nil {
		t.Fatal(err)
	}
	var ex struct {
		Endpoint string         `json:"endpoint"`
		Rank     *int           `json:"rank"`
		Scores   map[string]int `json:"scores"`
	}
	json.NewDecoder(res.Body).Decode(&ex)
	res.Body.Close()
	if ex.Endpoint != "e" || ex.Rank == nil || *ex.Rank != 1 || ex.Scores["e#1"] != nA || ex.Scores["e#0"] != 0 {
		t.Fatalf("explain: %+v (rank %v)", ex, ex.Rank)
	}

	// B on both ranks, then rank 0 evicts it (its pool refills with other prompts).
	g.send(t, b, 0)
	g.send(t, b, 1)
	kB := g.keys(t, b)
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out: %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if !g.d.Ranks[0].Pool().Cached(kB[0]) {
		t.Fatal("rank 0 does not hold B before the fill")
	}
	for i := 0; g.d.Ranks[0].Pool().Cached(kB[0]); i++ {
		if i > 20 {
			t.Fatal("rank 0 never evicted B")
		}
		g.send(t, dpPrompt(fmt.Sprintf("filler%d", i)), 0)
	}
	if !g.d.Ranks[1].Pool().Cached(kB[0]) {
		t.Fatal("rank 1 lost B")
	}
	// kvgate saw the eviction on rank 0 and still routes B to rank 1, a hit.
	waitFor("B's eviction on rank 0", func() bool {
		served, route := g.send(t, b, -1)
		return served == "1" && route == "kv-hit"
	})

	// Rank 1 restarts: after its next batch (seq back to 0) kvgate holds only that batch's
	// keys for rank 1, and rank 0's are untouched.
	before := g.rankKeys(t)
	g.d.RestartRank(1)
	c := dpPrompt("charlie")
	g.send(t, c, 1)
	nC := len(g.keys(t, c))
	g.waitKeys(t, "rank 1 restart", func(k []int) bool { return k[1] == nC })
	if after := g.rankKeys(t); after[0] != before[0] {
		t.Fatalf("rank 0's keys went %d -> %d on rank 1's restart", before[0], after[0])
	}
	// A is gone from rank 1 with the restart: kvgate no longer calls it a hit there.
	if _, route := g.send(t, a, -1); route == "kv-hit" {
		t.Fatalf("A still a hit after the restart of the only rank that held it")
	}
}
