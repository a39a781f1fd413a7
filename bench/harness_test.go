package bench

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginesim"
	"github.com/kvgate/kvgate/internal/testfix"
)

func TestTraceWorkload(t *testing.T) {
	jsonl := `{"timestamp": 0, "input_length": 1100, "output_length": 500, "hash_ids": [0, 1, 2]}
{"timestamp": 2000, "input_length": 1030, "output_length": 3, "hash_ids": [0, 1, 7]}

{"timestamp": 1000, "input_length": 600, "output_length": 10, "hash_ids": [5, 6]}
`
	w, err := Trace{Path: "t.jsonl", BlockTokens: 8, TimeScale: 0.5, MaxTokens: 100}.read(strings.NewReader(jsonl))
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Sessions) != 3 || w.Requests() != 3 {
		t.Fatalf("%d sessions", len(w.Sessions))
	}
	// Sorted by arrival, scaled by 0.5.
	s0, s1, s2 := w.Sessions[0], w.Sessions[1], w.Sessions[2]
	if s0.At != 0 || s1.At != 500*time.Millisecond || s2.At != time.Second {
		t.Fatalf("arrivals %v %v %v", s0.At, s1.At, s2.At)
	}
	if s0.MaxTokens != 100 || s2.MaxTokens != 3 || s0.Chat {
		t.Fatalf("max tokens %d %d (cap 100), chat %v", s0.MaxTokens, s2.MaxTokens, s0.Chat)
	}
	words := func(s string) []string { return strings.Fields(s) }
	a, b := words(s0.Prompts[0]), words(s2.Prompts[0])
	// Line 1: ids 0,1 full (8 words each) + last block 1100-1024 = 76 of 512 tokens -> 76*8/512 = 1 word.
	// Line 2: ids 0,1 full + 1030-1024 = 6 tokens -> max(1, 0) = 1 word.
	if len(a) != 17 || len(b) != 17 {
		t.Fatalf("prompt words %d and %d, want 17", len(a), len(b))
	}
	if strings.Join(a[:16], " ") != strings.Join(b[:16], " ") {
		t.Fatal("requests sharing hash ids 0,1 must share their first 16 words")
	}
	if c := words(s1.Prompts[0]); len(c) != 8+(600-512)*8/512 || c[0] == a[0] && c[1] == a[1] && c[2] == a[2] {
		t.Fatalf("hash ids 5,6: %d words, or shares id 0's text", len(c))
	}
	for _, bad := range []string{`{"timestamp": 0, "input_length": 10, "hash_ids": []}`, `{"timestamp": 0`, `{"timestamp": -1, "input_length": 10, "hash_ids": [1]}`} {
		if _, err := (Trace{Path: "bad.jsonl"}).read(strings.NewReader("\n" + bad)); err == nil || !strings.Contains(err.Error(), "bad.jsonl:2") {
			t.Errorf("%s: err %v, want one naming bad.jsonl:2", bad, err)
		}
	}
}

func TestSharedPrefixAndRAGWorkloads(t *testing.T) {
	w := SharedPrefix{SystemPrompts: 3, Users: 7, Turns: 2, SystemTokens: 50, TurnTokens: 5, MaxTokens: 4, Spread: time.Second, Seed: 9}.Build()
	if len(w.Sessions) != 7 || w.Requests() != 14 {
		t.Fatalf("%d sessions, %d requests", len(w.Sessions), w.Requests())
	}
	systems := map[string]int{}
	for _, s := range w.Sessions {
		systems[s.System]++
		if !s.Chat || len(s.Prompts) != 2 || s.At < 0 || s.At >= time.Second || s.Prompts[0] == s.Prompts[1] {
			t.Fatalf("session %+v", s)
		}
	}
	if len(systems) != 3 {
		t.Fatalf("%d distinct system prompts, want 3", len(systems))
	}
	again := SharedPrefix{SystemPrompts: 3, Users: 7, Turns: 2, SystemTokens: 50, TurnTokens: 5, MaxTokens: 4, Spread: time.Second, Seed: 9}.Build()
	if again.Sessions[3].Prompts[1] != w.Sessions[3].Prompts[1] {
		t.Fatal("the same seed must build the same workload")
	}
	r := RAG{Documents: 5, DocTokens: 20, Queries: 10, DocsPerQuery: 2, QueryTokens: 4, Seed: 1}.Build()
	if len(r.Sessions) != 10 || strings.Count(r.Sessions[0].Prompts[0], "Document ") != 2 {
		t.Fatalf("rag %d sessions, first %q", len(r.Sessions), r.Sessions[0].Prompts[0])
	}
}

var (
	buildOnce sync.Once
	kvgateBin string
	buildErr  error
)

// buildKvgate compiles ./cmd/kvgate once per test binary: the harness runs it as the router.
func buildKvgate(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kvgate-bench-test-")
		if err != nil {
			buildErr = err
			return
		}
		kvgateBin = filepath.Join(dir, "kvgate")
		gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
		cmd := exec.Command(gobin, "build", "-o", kvgateBin, "../cmd/kvgate")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			buildErr = err
			kvgateBin = out.String()
		}
	})
	if buildErr != nil {
		t.Fatalf("go build ./cmd/kvgate: %v\n%s", buildErr, kvgateBin)
	}
	return kvgateBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if kvgateBin != "" && buildErr == nil {
		os.RemoveAll(filepath.Dir(kvgateBin))
	}
	os.Exit(code)
}

// tinyConfig is a shared-prefix workload of a few seconds: 2 system prompts, 8 users,
// 4 turns, on 4 engines that tokenize with the real Qwen3 tokenizer and chat template,
// as kvgate does.
func tinyConfig(t *testing.T, policies ...Policy) Config {
	dir := testfix.TokenizerDir(t, "qwen3")
	enc, err := enginesim.LoadEncoder("qwen3", dir)
	if err != nil {
		t.Fatal(err)
	}
	// Think time lets each turn's KV events reach kvgate before the user's next turn, even
	// on a loaded machine under -race.
	w := SharedPrefix{SystemPrompts: 2, Users: 8, Turns: 4, SystemTokens: 200, TurnTokens: 20, MaxTokens: 4,
		Spread: 400 * time.Millisecond, Think: 150 * time.Millisecond, Seed: 3, Words: FilterWords(enc, Words)}.Build()
	return Config{Engines: 4, Workload: w, Policies: policies, Kvgate: buildKvgate(t), Tokenizer: dir,
		KvgateArgs: []string{"-kv-load-factor", "1"},
		Sim: enginesim.Spec{Encoder: enc, Model: "qwen3", BlockSize: 16, NumBlocks: 512, MaxBatch: 8,
			PrefillBase: time.Millisecond, PrefillPerToken: 10 * time.Microsecond, DecodePerToken: time.Millisecond}}
}

// A short run through kvgate: the report has its shape, every request succeeds, and both
// KV-Exact (through kvgate, fed by the engines' ZeroMQ events) and the oracle placement
// deliver more cache hits than round-robin on a shared-prefix workload.
func TestEndToEndReport(t *testing.T) {
	rr, _ := PolicyByName("rr")
	kv, _ := PolicyByName("kv-exact")
	cfg := tinyConfig(t, rr, kv, OraclePolicy())
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Policies) != 3 {
		t.Fatalf("%d policy results", len(res.Policies))
	}
	for _, p := range res.Policies {
		if p.Requests != 32 || p.Errors != 0 || len(p.TTFT) != 32 || len(p.Endpoints) != 4 {
			t.Fatalf("%s: %d requests, %d errors (%s), %d TTFTs, %d endpoints", p.Policy, p.Requests, p.Errors, p.FirstErr, len(p.TTFT), len(p.Endpoints))
		}
		var served uint64
		for _, e := range p.Endpoints {
			served += e.Requests
		}
		if served != 32 {
			t.Fatalf("%s: engines served %d requests, want 32", p.Policy, served)
		}
	}
	var tbl bytes.Buffer
	res.WriteTable(&tbl)
	t.Logf("\n%s", tbl.String())
	rrRes, kvRes, or := res.Find("rr"), res.Find("kv-exact"), res.Find("oracle")
	// rr spreads each user's turns over the engines, so a turn's history is cached only
	// where its previous turn ran; KV-Exact and the oracle follow it.
	if !(kvRes.HitRatio() > rrRes.HitRatio()) || !(or.HitRatio() > rrRes.HitRatio()) {
		t.Fatalf("hit ratio: kv-exact %.3f, oracle %.3f, rr %.3f: want both above rr", kvRes.HitRatio(), or.HitRatio(), rrRes.HitRatio())
	}
	if rrRes.RequestImbalance() > 1.01 {
		t.Fatalf("rr request imbalance %.2f: round-robin over 32 requests on 4 engines is even", rrRes.RequestImbalance())
	}
	dir := t.TempDir()
	plots, err := res.WritePlots(dir)
	if err != nil {
		t.Fatal(err)
	}
	var md bytes.Buffer
	res.WriteReport(&md, "test", plots)
	rep := md.String()
	for _, want := range []string{"| policy | requests | errors | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms |", "\n| rr | 32 | 0 |",
		"\n| kv-exact | 32 | 0 |", "\n| oracle | 32 | 0 |", "Targets:", "kvgate flags added to every kvgate policy: `-kv-load-factor 1`", "## Load per endpoint", "![ttft-cdf](ttft-cdf.svg)", "![hit-ratio](hit-ratio.svg)", "![load](load.svg)"} {
		if !strings.Contains(rep, want) {
			t.Errorf("report lacks %q:\n%s", want, rep)
		}
	}
	for _, p := range plots {
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil || !bytes.Contains(b, []byte("<svg")) || !bytes.Contains(b, []byte("oracle")) && p != "hit-ratio.svg" {
			t.Errorf("%s: not an SVG naming the policies (%v)", p, err)
		}
	}
}

// A short overhead run: direct, kvgate and kvgate-plain rows for one prompt size, no
// errors, each path's process CPU read on Linux, kvgate's stage histograms read back per
// phase, nginx reported as skipped when its binary is absent.
func TestOverheadShape(t *testing.T) {
	dir := testfix.TokenizerDir(t, "qwen3")
	enc, err := enginesim.LoadEncoder("qwen3", dir)
	if err != nil {
		t.Fatal(err)
	}
	res, err := RunOverhead(context.Background(), OverheadConfig{
		Sim: enginesim.Spec{Model: "qwen3", BlockSize: 16}, Kvgate: buildKvgate(t), Tokenizer: dir,
		Words: FilterWords(enc, Words), PromptTokens: []int{256}, Requests: 20, Warmup: 3, Concurrency: 2,
		ThroughputFor: 300 * time.Millisecond, Nginx: filepath.Join(t.TempDir(), "no-nginx"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Rounds != 3 || res.Round != 100*time.Millisecond {
		t.Errorf("req/s in %d rounds of %v, want 3 of 100ms", res.Rounds, res.Round)
	}
	if len(res.Rows) != 3 || res.Rows[0].Path != "direct" || res.Rows[1].Path != "kvgate" || res.Rows[2].Path != "kvgate-plain" {
		t.Fatalf("rows %+v", res.Rows)
	}
	if runtime.GOOS == "linux" {
		for _, r := range res.Rows {
			// A request costs a proxy at least a few microseconds and less than a second.
			if r.CPU < time.Microsecond || r.CPU > time.Second || r.CPULoaded < time.Microsecond || r.CPULoaded > time.Second {
				t.Errorf("%s: CPU per request %v sequential, %v loaded", r.Path, r.CPU, r.CPULoaded)
			}
			if r.Steal < 0 || r.Steal > 100 {
				t.Errorf("%s: host steal %.2f%% over its req/s rounds, want a share read from /proc/stat", r.Path, r.Steal)
			}
		}
	}
	for _, r := range res.Rows {
		// 256 single-token words in the system message plus the Qwen3 template's tokens.
		if r.N != 20 || r.Errors != 0 || r.Tokens <= 256 || r.Tokens > 300 || r.RPS <= 0 || r.P50 <= 0 || r.P99 < r.P50 {
			t.Fatalf("row %+v", r)
		}
	}
	phases := map[string]int64{}
	for _, st := range res.Stages {
		if st.Stage == "tokenize" {
			phases[st.Phase] += st.Count
		}
	}
	// The sequential phase counts the 20 requests after the warm-up, exactly.
	if phases["sequential"] != 20 || phases["loaded"] <= 0 {
		t.Fatalf("tokenize stage counts per phase %v (stages %+v)", phases, res.Stages)
	}
	// Every sequential kvgate request made exactly one first decision: 3 warm-up + 20.
	if len(res.Routes) != 1 || res.Routes[0].Count != 23 || res.Routes[0].P50 <= 0 || res.Routes[0].P99 < res.Routes[0].P50 {
		t.Fatalf("routing overhead rows %+v", res.Routes)
	}
	if !strings.Contains(res.Note, "skipped") {
		t.Fatalf("note %q", res.Note)
	}
	var md bytes.Buffer
	res.WriteReport(&md)
	if !strings.Contains(md.String(), "| 256 |") && !strings.Contains(md.String(), "| direct | 20 | 0 |") {
		t.Fatalf("report:\n%s", md.String())
	}
}

// Two kvgate replicas, each subscribed to every engine: clients alternate between them,
// every request succeeds, and both route on the KV events they receive (more hits than
// round-robin's baseline on this workload, measured in TestEndToEndReport).
func TestReplicas(t *testing.T) {
	kv, _ := PolicyByName("kv-exact")
	rr, _ := PolicyByName("rr")
	cfg := tinyConfig(t, rr, kv)
	cfg.Replicas = 2
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var tbl bytes.Buffer
	res.WriteTable(&tbl)
	t.Logf("\n%s", tbl.String())
	for _, name := range []string{"rr", "kv-exact"} {
		p := res.Find(name)
		if p == nil || p.Requests != 32 || p.Errors != 0 {
			t.Fatalf("%s: %+v", name, p)
		}
		// 8 sessions of 4 turns, sessions alternating over the replicas.
		if len(p.ReplicaRequests) != 2 || p.ReplicaRequests[0] != 16 || p.ReplicaRequests[1] != 16 {
			t.Fatalf("%s: requests per replica %v, want [16 16]", name, p.ReplicaRequests)
		}
	}
	if kvr, rrr := res.Find("kv-exact"), res.Find("rr"); !(kvr.HitRatio() > rrr.HitRatio()) {
		t.Fatalf("hit ratio with 2 replicas: kv-exact %.3f, rr %.3f", kvr.HitRatio(), rrr.HitRatio())
	}
	var md bytes.Buffer
	res.WriteReport(&md, "replicas", nil)
	if !strings.Contains(md.String(), "ran 2 `kvgate serve` replicas") || !strings.Contains(md.String(), "- kv-exact requests per kvgate replica: 16 16") {
		t.Fatalf("report:\n%s", md.String())
	}
}
