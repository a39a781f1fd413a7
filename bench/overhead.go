package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/bench/enginesim"
)

// OverheadConfig measures what routing through kvgate costs per request: the same chat
// requests go to a zero-latency engine directly, through kvgate (KV-Exact mode 3, so the
// whole routing path runs: parse, template, tokenize, hash, score) and, when nginx is
// installed, through nginx proxy_pass as a plain-proxy baseline.
type OverheadConfig struct {
	Sim           enginesim.Spec // latency fields are zeroed
	Kvgate        string
	KvgateArgs    []string
	Tokenizer     string
	Words         []string
	PromptTokens  []int         // default 1024 and 4096
	Requests      int           // sequential requests per size and path (default 300)
	Warmup        int           // unmeasured requests first (default 30)
	Concurrency   int           // clients in the req/s measurement (default 8)
	ThroughputFor time.Duration // per path and prompt size, in rounds (throughputRounds); default 3s
	Nginx         string        // nginx binary; skipped when it does not exist
	Progress      io.Writer
}

// OverheadRow is one path at one prompt size.
type OverheadRow struct {
	PromptTokens int // requested size in words (the engine's count is Tokens)
	Tokens       int // prompt tokens as the engine counted them
	Path         string
	N, Errors    int
	P50, P99     time.Duration
	AddedP50     time.Duration // vs direct
	AddedP99     time.Duration
	RPS          float64
	// On-CPU time of the path's process (the proxy; the engine for direct) per request,
	// over the sequential requests after the warm-up (CPU; the engine's per request of
	// any path, as it serves them all) and the req/s rounds (CPULoaded); 0 where /proc
	// cannot be read. Less load-dependent than wall times. A KV-Exact kvgate also ingests
	// the engine's KV events of every path's requests, and idle-to-busy transitions
	// (the Go scheduler's spinning) count in the sequential figure.
	CPU, CPULoaded time.Duration
	// Steal is the host's steal over this path's req/s rounds, percent of the machine's
	// CPU time (/proc/stat); -1 where it cannot be read. Paths whose rounds differ much
	// in it ran on machines of different speed, and their req/s do not compare.
	Steal float64
}

// StageRow is the mean time of one routing stage at one prompt size in one phase of the
// run: "sequential" (the latency requests after the warm-up: one at a time, as the added
// p50 sees them; warm-up excluded) or "loaded" (the req/s clients, more of them than cores, so a stage's
// wall time there includes waiting for a CPU).
type StageRow struct {
	PromptTokens int
	Phase        string
	Stage        string
	Mean         time.Duration
	Count        int64
}

// RouteRow is the whole routing overhead (parse + template + tokenize + hash + score +
// select, steps 1-5) at one prompt size over the sequential (unloaded) requests, warm-up
// included, from kvgate's kvgate_route_seconds histogram. The
// quantiles are bucket upper bounds, so they overstate by at most one bucket (~13%).
type RouteRow struct {
	PromptTokens int
	Count        int64
	P50, P99     time.Duration
}

// OverheadResult is the overhead comparison.
type OverheadResult struct {
	Rows   []OverheadRow
	Stages []StageRow // kvgate's per-stage routing time, from its /metrics
	Routes []RouteRow // kvgate's whole routing overhead, from its /metrics
	Note   string
	Mode   string
	Procs  int
	// Rounds of Round each per path and prompt size made the req/s (throughputRounds).
	Rounds int
	Round  time.Duration
}

type ohPath struct {
	name string
	url  string
	pid  int // the process serving the path (the engine's for direct), for its CPU time
}

// startOverheadKvgate runs one kvgate in front of env's engine and returns its process id
// and URL.
func startOverheadKvgate(ctx context.Context, env *Env, withEvents bool, flags []string, admin string) (int, string, func() error, error) {
	listen, err := freePort()
	if err != nil {
		return 0, "", nil, err
	}
	args := ServeArgs(env, listen, admin, withEvents, flags)
	pid, stop, err := startProc(ctx, env.Kvgate, args, "http://"+admin+"/readyz")
	if err != nil {
		return 0, "", nil, fmt.Errorf("kvgate: %w", err)
	}
	return pid, "http://" + listen, stop, nil
}

// RunOverhead runs the measurement and stops everything it started.
func RunOverhead(ctx context.Context, cfg OverheadConfig) (*OverheadResult, error) {
	if len(cfg.PromptTokens) == 0 {
		cfg.PromptTokens = []int{1024, 4096}
	}
	if cfg.Requests <= 0 {
		cfg.Requests = 300
	}
	if cfg.Warmup <= 0 {
		cfg.Warmup = 30
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 8
	}
	if cfg.ThroughputFor <= 0 {
		cfg.ThroughputFor = 3 * time.Second
	}
	// The engine runs as its own process (`kvgate engine-sim`), so the load generator's
	// garbage and scheduling do not land on it.
	simAddr, err := freePort()
	if err != nil {
		return nil, err
	}
	evAddr, err := freePort()
	if err != nil {
		return nil, err
	}
	sp := cfg.Sim
	tok := cfg.Tokenizer
	if tok == "" {
		tok = "words"
	}
	simArgs := []string{"engine-sim", "-listen", simAddr, "-name", "e0", "-model", orDefault(sp.Model, "sim"), "-tokenizer", tok,
		"-prefill-base", "0s", "-prefill-per-token", "0s", "-decode-per-token", "0s", "-max-tokens", "1",
		"-num-blocks", "65536", "-max-batch", "256", "-kv-events", "tcp://" + evAddr}
	if sp.BlockSize > 0 {
		simArgs = append(simArgs, "-block-size", strconv.Itoa(sp.BlockSize))
	}
	if sp.HashAlgo != "" {
		simArgs = append(simArgs, "-prefix-caching-hash-algo", sp.HashAlgo)
	}
	if sp.SeedSet {
		simArgs = append(simArgs, "-hash-seed", sp.HashSeed)
	}
	simPID, stopSim, err := startProc(ctx, cfg.Kvgate, simArgs, "http://"+simAddr+"/health")
	if err != nil {
		return nil, fmt.Errorf("engine-sim: %w", err)
	}
	defer stopSim()
	bs := sp.BlockSize
	if bs <= 0 {
		bs = 16
	}
	env := &Env{Remote: []RemoteEngine{{URL: "http://" + simAddr, Events: "tcp://" + evAddr}}, Engine: "vllm",
		HashAlgo: sp.HashAlgo, HashSeed: sp.HashSeed, SeedSet: sp.SeedSet, BlockSize: bs, Model: orDefault(sp.Model, "sim"),
		Tokenizer: cfg.Tokenizer, Kvgate: cfg.Kvgate, KvgateArgs: cfg.KvgateArgs}
	admin, err := freePort()
	if err != nil {
		return nil, err
	}
	mode := "KV-Exact mode 3: every request is parsed, templated, tokenized, hashed and scored"
	flags := []string{"-select", "rr", "-kv-mode", "3", "-kv-score", "overlap"}
	if cfg.Tokenizer == "" {
		mode = "-kv-mode off (no tokenizer given): proxying cost only, no routing work"
		flags = []string{"-select", "rr", "-kv-mode", "off"}
	}
	kvPID, kvURL, stopKv, err := startOverheadKvgate(ctx, env, cfg.Tokenizer != "", flags, admin)
	if err != nil {
		return nil, err
	}
	defer stopKv()
	paths := []ohPath{{"direct", "http://" + simAddr, simPID}, {"kvgate", kvURL, kvPID}}
	if cfg.Tokenizer != "" {
		// The same proxy doing no routing work: its added latency is the HTTP path's
		// alone, so kvgate's minus kvgate-plain's is what routing adds.
		plainAdmin, err := freePort()
		if err != nil {
			return nil, err
		}
		pid, url, stop, err := startOverheadKvgate(ctx, env, false, []string{"-select", "rr", "-kv-mode", "off"}, plainAdmin)
		if err != nil {
			return nil, err
		}
		defer stop()
		paths = append(paths, ohPath{"kvgate-plain", url, pid})
	}
	res := &OverheadResult{Procs: runtime.GOMAXPROCS(0), Mode: mode}
	if st, err := os.Stat(cfg.Nginx); err == nil && !st.IsDir() {
		pid, url, stopNg, err := startNginx(ctx, cfg.Nginx, simAddr)
		if err != nil {
			res.Note = fmt.Sprintf("nginx baseline failed to start: %v", err)
		} else {
			defer stopNg()
			paths = append(paths, ohPath{"nginx", url, pid})
		}
	} else {
		res.Note = fmt.Sprintf("nginx baseline skipped: %s not installed", cfg.Nginx)
	}
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	metricsURL := "http://" + admin + "/metrics"
	for _, size := range cfg.PromptTokens {
		var before map[string]stageSum // after the warm-up
		routeBefore := scrapeBuckets(metricsURL, "kvgate_route_seconds_bucket")
		system := Text(cfg.Words, uint64(size), size)
		body := func(i int) []byte {
			b, _ := json.Marshal(&requestBody{Model: env.Model, MaxTokens: 1, Messages: []chatMessage{
				{Role: "system", Content: system}, {Role: "user", Content: "question " + strconv.Itoa(i)}}})
			return b
		}
		lat := make([][]time.Duration, len(paths))
		errs := make([]int, len(paths))
		cpuSeq := make([]time.Duration, len(paths))
		tokens := 0
		total := cfg.Warmup + cfg.Requests
		for i := 0; i < total; i++ {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if i == cfg.Warmup {
				before = scrapeStages(metricsURL)
				for j, p := range paths {
					cpuSeq[j] = -procCPU(p.pid)
				}
			}
			b := body(i)
			// Interleave the paths so machine noise hits them alike.
			for j, p := range paths {
				d, pt, err := doOnce(ctx, hc, p.url+"/v1/chat/completions", b)
				if i < cfg.Warmup {
					continue
				}
				if err != nil {
					errs[j]++
					continue
				}
				tokens = pt
				lat[j] = append(lat[j], d)
			}
			if cfg.Progress != nil && i%10 == 0 {
				progress(cfg.Progress, fmt.Sprintf("overhead %d", size), i, total, 0)
			}
		}
		if cfg.Progress != nil {
			progress(cfg.Progress, fmt.Sprintf("overhead %d", size), total, total, 0)
			fmt.Fprintln(cfg.Progress)
		}
		// The routing quantiles cover the sequential requests only: under the saturating
		// req/s load below they would measure CPU queueing, not routing.
		if rr, ok := routeQuantiles(routeBefore, scrapeBuckets(metricsURL, "kvgate_route_seconds_bucket")); ok {
			rr.PromptTokens = tokens
			res.Routes = append(res.Routes, rr)
		}
		for j, p := range paths {
			cpuSeq[j] += procCPU(p.pid)
		}
		sequential := scrapeStages(metricsURL)
		res.Stages = appendStages(res.Stages, tokens, "sequential", before, sequential)
		// req/s: pre-built bodies, paths alternating over rounds so that machine noise
		// (other processes on the box, the host's steal) hits them alike.
		bodies := make([][]byte, 64)
		for i := range bodies {
			bodies[i] = body(total + i)
		}
		counts := make([]int64, len(paths))
		spent := make([]time.Duration, len(paths))
		cpuLoad := make([]time.Duration, len(paths))
		steal := make([]stealWindow, len(paths))
		rounds, each := throughputRounds(cfg.ThroughputFor)
		res.Rounds, res.Round = rounds, each
		for round := 0; round < rounds; round++ {
			for j, p := range paths {
				c0 := procCPU(p.pid)
				steal[j].begin()
				n, d := throughput(ctx, hc, p.url+"/v1/chat/completions", bodies, cfg.Concurrency, each)
				steal[j].end()
				cpuLoad[j] += procCPU(p.pid) - c0
				counts[j] += n
				spent[j] += d
			}
		}
		var base OverheadRow
		for j, p := range paths {
			slices.Sort(lat[j])
			row := OverheadRow{PromptTokens: size, Tokens: tokens, Path: p.name, N: len(lat[j]), Errors: errs[j],
				P50: Percentile(lat[j], 50), P99: Percentile(lat[j], 99), RPS: float64(counts[j]) / spent[j].Seconds(),
				Steal: steal[j].percent()}
			n := len(lat[j]) + errs[j]
			if j == 0 { // the engine serves every path's requests
				n = 0
				for k := range paths {
					n += len(lat[k]) + errs[k]
				}
			}
			if n > 0 && cpuSeq[j] > 0 {
				row.CPU = cpuSeq[j] / time.Duration(n)
			}
			if counts[j] > 0 && cpuLoad[j] > 0 {
				row.CPULoaded = cpuLoad[j] / time.Duration(counts[j])
			}
			if j == 0 {
				base = row
			} else {
				row.AddedP50, row.AddedP99 = row.P50-base.P50, row.P99-base.P99
			}
			res.Rows = append(res.Rows, row)
		}
		res.Stages = appendStages(res.Stages, tokens, "loaded", sequential, scrapeStages(metricsURL))
	}
	if w := stealWarning(res.Rows); w != "" {
		res.Note = strings.TrimSpace(res.Note + "\n\n" + w)
	}
	return res, nil
}

// stealWarning names the rows whose req/s rounds the host stole stealWarnPercent or more
// from, "" when none: their req/s were measured on a slowed machine and compare with
// other rows only as far as the steal was alike.
func stealWarning(rows []OverheadRow) string {
	var b strings.Builder
	for _, r := range rows {
		if r.Steal < stealWarnPercent {
			continue
		}
		if b.Len() == 0 {
			b.WriteString("WARN: host steal over the req/s rounds of")
		} else {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, " %s at %d tokens (%.1f%%)", r.Path, r.Tokens, r.Steal)
	}
	if b.Len() == 0 {
		return ""
	}
	b.WriteString(": the hypervisor ran other guests on these cores, so those req/s were measured on a slower machine.")
	return b.String()
}

// appendStages appends the mean of each stage observed between two scrapes.
func appendStages(rows []StageRow, tokens int, phase string, before, after map[string]stageSum) []StageRow {
	for _, st := range sortedKeys(after) {
		a, b := after[st], before[st]
		if n := a.count - b.count; n > 0 {
			rows = append(rows, StageRow{PromptTokens: tokens, Phase: phase, Stage: st, Count: int64(n),
				Mean: time.Duration((a.sum - b.sum) / n * float64(time.Second))})
		}
	}
	return rows
}

// doOnce sends one non-streaming request and returns its latency and prompt tokens.
func doOnce(ctx context.Context, hc *http.Client, url string, body []byte) (time.Duration, int, error) {
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, 0, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := time.Since(start)
	if err != nil {
		return 0, 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("HTTP %d: %.200s", resp.StatusCode, b)
	}
	var u struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	_ = json.Unmarshal(b, &u)
	return d, u.Usage.PromptTokens, nil
}

// throughputRounds splits a path's req/s measurement of d into rounds of about a second,
// at least three: the paths take turns round by round, so the longer the measurement the
// finer the alternation, and a drift in the machine's speed over seconds (the host's
// steal comes and goes on that scale) falls on every path alike instead of on the one
// measured while it lasted.
func throughputRounds(d time.Duration) (int, time.Duration) {
	n := max(int(d/time.Second), 3)
	return n, d / time.Duration(n)
}

// throughput runs conc clients back to back for d and returns the completed requests and
// the time they took.
func throughput(ctx context.Context, hc *http.Client, url string, bodies [][]byte, conc int, d time.Duration) (int64, time.Duration) {
	var n atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	start := time.Now()
	for c := 0; c < conc; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			for i := c; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				if _, pt, err := doOnce(ctx, hc, url, bodies[i%len(bodies)]); err == nil && pt > 0 {
					n.Add(1)
				}
			}
		}(c)
	}
	wg.Wait()
	return n.Load(), time.Since(start)
}

type stageSum struct{ sum, count float64 }

// scrapeStages reads kvgate's per-stage timing histograms (the _sum and _count series of
// metrics whose names contain "stage", keyed by their stage label) from its /metrics.
func scrapeStages(url string) map[string]stageSum {
	out := map[string]stageSum{}
	scrapeLines(url, func(l string) {
		if strings.HasPrefix(l, "#") || !strings.Contains(l, "stage") {
			return
		}
		sp := strings.LastIndexByte(l, ' ')
		lb, le := strings.IndexByte(l, '{'), strings.IndexByte(l, '}')
		if sp < 0 || lb < 0 || le < lb {
			return
		}
		name := l[:lb]
		v, err := strconv.ParseFloat(l[sp+1:], 64)
		if err != nil {
			return
		}
		stage := ""
		for _, kv := range strings.Split(l[lb+1:le], ",") {
			if k, val, ok := strings.Cut(kv, "="); ok && k == "stage" {
				stage = strings.Trim(val, `"`)
			}
		}
		if stage == "" {
			return
		}
		e := out[stage]
		switch {
		case strings.HasSuffix(name, "_sum"):
			e.sum = v
		case strings.HasSuffix(name, "_count"):
			e.count = v
		default:
			return
		}
		out[stage] = e
	})
	return out
}

// scrapeBuckets reads one Prometheus histogram's cumulative buckets from /metrics: le
// bound -> count.
func scrapeBuckets(url, series string) map[string]float64 {
	out := map[string]float64{}
	prefix := series + `{le="`
	scrapeLines(url, func(l string) {
		if !strings.HasPrefix(l, prefix) {
			return
		}
		rest := l[len(prefix):]
		q := strings.IndexByte(rest, '"')
		sp := strings.LastIndexByte(rest, ' ')
		if q < 0 || sp < q {
			return
		}
		if v, err := strconv.ParseFloat(rest[sp+1:], 64); err == nil {
			out[rest[:q]] = v
		}
	})
	return out
}

// scrapeLines calls line for each line of a /metrics page (none when it cannot be read).
func scrapeLines(url string, line func(string)) {
	resp, err := http.Get(url)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<22)
	for sc.Scan() {
		line(sc.Text())
	}
}

// routeQuantiles turns the cumulative bucket counts added between two scrapes into p50
// and p99, each the upper bound (le) of the first bucket whose count reaches that rank;
// a rank only the +Inf bucket reaches takes the largest finite bound.
func routeQuantiles(before, after map[string]float64) (RouteRow, bool) {
	type bucket struct{ le, n float64 }
	var bs []bucket
	for le, a := range after {
		bound, err := strconv.ParseFloat(le, 64) // "+Inf" parses as +Inf
		if err != nil {
			continue
		}
		bs = append(bs, bucket{bound, a - before[le]})
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	if len(bs) == 0 || bs[len(bs)-1].n <= 0 {
		return RouteRow{}, false
	}
	total := bs[len(bs)-1].n
	at := func(q float64) time.Duration {
		last := 0.0
		for _, b := range bs {
			if !math.IsInf(b.le, 1) {
				last = b.le
			}
			if b.n >= q*total {
				return time.Duration(last * float64(time.Second))
			}
		}
		return time.Duration(last * float64(time.Second))
	}
	return RouteRow{Count: int64(total), P50: at(0.50), P99: at(0.99)}, true
}

func sortedKeys(m map[string]stageSum) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// startChild runs a child process and waits until readyURL answers 200.
func startChild(ctx context.Context, bin string, args []string, readyURL string) (func() error, error) {
	_, stop, err := startProc(ctx, bin, args, readyURL)
	return stop, err
}

// startProc is startChild that also returns the child's process id.
func startProc(ctx context.Context, bin string, args []string, readyURL string) (int, func() error, error) {
	cmd := exec.Command(bin, args...)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return 0, nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() error {
		select {
		case <-exited:
			return nil
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		return nil
	}
	hc := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(30 * time.Second); ; {
		select {
		case err := <-exited:
			exited <- err
			return 0, nil, fmt.Errorf("%s exited: %v\n%s", strings.Join(args, " "), err, tail(out.String(), 2000))
		default:
		}
		if resp, err := hc.Get(readyURL); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return cmd.Process.Pid, stop, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return 0, nil, fmt.Errorf("%s not ready: %s", strings.Join(args, " "), tail(out.String(), 2000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startNginx runs nginx in the foreground with a proxy_pass config to upstream.
func startNginx(ctx context.Context, bin, upstream string) (int, string, func() error, error) {
	dir, err := os.MkdirTemp("", "kvgate-bench-nginx-")
	if err != nil {
		return 0, "", nil, err
	}
	listen, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return 0, "", nil, err
	}
	conf := fmt.Sprintf(`worker_processes auto;
daemon off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  client_max_body_size 64m;
  client_body_buffer_size 1m;
  upstream engine { server %[2]s; keepalive 256; }
  server {
    listen %[3]s;
    location / {
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
`, dir, upstream, listen)
	cpath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(cpath, []byte(conf), 0o644); err != nil {
		os.RemoveAll(dir)
		return 0, "", nil, err
	}
	cmd := exec.Command(bin, "-p", dir, "-c", cpath, "-e", filepath.Join(dir, "error.log"))
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return 0, "", nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() error {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-exited:
			case <-time.After(5 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
		}
		return os.RemoveAll(dir)
	}
	url := "http://" + listen
	for deadline := time.Now().Add(10 * time.Second); ; {
		select {
		case err := <-exited:
			exited <- err
			stop()
			return 0, "", nil, fmt.Errorf("nginx exited: %v\n%s", err, out.String())
		default:
		}
		resp, err := http.Get(url + "/health")
		if err == nil {
			resp.Body.Close()
			return cmd.Process.Pid, url, stop, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return 0, "", nil, fmt.Errorf("nginx not answering on %s", listen)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WriteTable writes the overhead table.
func (r *OverheadResult) WriteTable(w io.Writer) {
	fmt.Fprintln(w, "| prompt (engine tokens) | path | requests | errors | p50 ms | p99 ms | added p50 ms | added p99 ms | req/s | CPU us/req | CPU us/req loaded | host steal % |")
	fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, row := range r.Rows {
		added50, added99 := "-", "-"
		if row.Path != "direct" {
			added50, added99 = fmt.Sprintf("%.3f", ms64(row.AddedP50)), fmt.Sprintf("%.3f", ms64(row.AddedP99))
		}
		fmt.Fprintf(w, "| %d | %s | %d | %d | %.3f | %.3f | %s | %s | %.0f | %s | %s | %s |\n", row.Tokens, row.Path, row.N, row.Errors,
			ms64(row.P50), ms64(row.P99), added50, added99, row.RPS, usOrDash(row.CPU), usOrDash(row.CPULoaded), percentOrDash(row.Steal))
	}
}

// WriteRoutes writes the whole routing overhead per prompt size.
func (r *OverheadResult) WriteRoutes(w io.Writer) {
	fmt.Fprintln(w, "| prompt (engine tokens) | requests | routing p50 us | routing p99 us |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|")
	for _, rr := range r.Routes {
		fmt.Fprintf(w, "| %d | %d | %.0f | %.0f |\n", rr.PromptTokens, rr.Count,
			float64(rr.P50)/float64(time.Microsecond), float64(rr.P99)/float64(time.Microsecond))
	}
}

// WriteStages writes the per-stage breakdown.
func (r *OverheadResult) WriteStages(w io.Writer) {
	fmt.Fprintln(w, "| prompt (engine tokens) | phase | stage | requests | mean us |")
	fmt.Fprintln(w, "|---:|---|---|---:|---:|")
	for _, s := range r.Stages {
		fmt.Fprintf(w, "| %d | %s | %s | %d | %.1f |\n", s.PromptTokens, s.Phase, s.Stage, s.Count, float64(s.Mean)/float64(time.Microsecond))
	}
}

// percentOrDash prints a percentage, "-" for the -1 of one that could not be read.
func percentOrDash(p float64) string {
	if p < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", p)
}

func usOrDash(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", float64(d)/float64(time.Microsecond))
}

// procCPU is the on-CPU time of process pid and of its direct children (nginx's workers)
// so far: the sum over their threads of /proc's schedstat run time (nanoseconds, unlike
// the 10 ms ticks of /proc/PID/stat). 0 when /proc cannot be read.
func procCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	total := threadsCPU(pid)
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, c := range strings.Fields(string(b)) {
			if cp, err := strconv.Atoi(c); err == nil {
				total += threadsCPU(cp)
			}
		}
	}
	return total
}

func threadsCPU(pid int) time.Duration {
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var total time.Duration
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread exited
		}
		if f, _, ok := strings.Cut(string(b), " "); ok {
			if ns, err := strconv.ParseInt(f, 10, 64); err == nil {
				total += time.Duration(ns)
			}
		}
	}
	return total
}

func ms64(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// WriteReport writes the overhead report.
func (r *OverheadResult) WriteReport(w io.Writer) {
	fmt.Fprintln(w, "# kvgate routing overhead")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Chat requests (max_tokens 1, not streamed) to a zero-latency engine simulator, sequential and interleaved across paths; req/s with concurrent clients, the paths taking turns over %d rounds of %v each. GOMAXPROCS=%d.\n", r.Rounds, r.Round, r.Procs)
	fmt.Fprintf(w, "kvgate runs %s.\n", r.Mode)
	fmt.Fprintln(w, "kvgate-plain is the same binary with -kv-mode off: its added latency and CPU are the HTTP path's alone, so kvgate's minus kvgate-plain's is what routing adds. CPU us/req is the path's own process (the engine's for direct), from /proc schedstat. Host steal % is the hypervisor's over the path's req/s rounds (/proc/stat): the share of the machine's CPU time given to other guests, so req/s of paths whose steal differs much were measured on machines of different speed.")
	fmt.Fprintln(w)
	r.WriteTable(w)
	fmt.Fprintln(w)
	if r.Note != "" {
		fmt.Fprintln(w, r.Note)
		fmt.Fprintln(w)
	}
	if len(r.Routes) > 0 {
		fmt.Fprintln(w, "## Routing overhead, steps 1-5 (kvgate_route_seconds; bucket upper bounds)")
		fmt.Fprintln(w)
		r.WriteRoutes(w)
		fmt.Fprintln(w)
	}
	if len(r.Stages) > 0 {
		fmt.Fprintln(w, "## Per-stage routing time (kvgate's own histograms, mean per request)")
		fmt.Fprintln(w)
		r.WriteStages(w)
	} else {
		fmt.Fprintln(w, "kvgate exported no per-stage timing series (metric names containing \"stage\").")
	}
}
