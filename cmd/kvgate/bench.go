package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/bench"
	"github.com/kvgate/kvgate/bench/enginesim"
	"github.com/kvgate/kvgate/tokenize"
)

func init() {
	register("bench", "compare routing policies on simulated engines (TTFT, hit ratio, load) or measure kvgate's overhead", runBench)
}

// defaultTokenizerDir is the qwen3 tokenizer `make fetch` stages (tokenize.StagedDir); a
// missing one fails later, when the load names the path.
func defaultTokenizerDir() string {
	dir, _ := tokenize.StagedDir("qwen3")
	return dir
}

func runBench(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	demo := fs.Bool("demo", false, "the README demo: 4 engines, shared-prefix and hot-prefix workloads at rates x1, x2, x4 under rr, chwbl, kv-exact and the oracle (overrides workload and policy flags; -rate-scale still applies)")
	overhead := fs.Bool("overhead", false, "measure kvgate's added latency and req/s against a direct connection to a zero-latency engine")
	fleet := fs.String("fleet", "", "fleet simulator: comma-separated fleet sizes (endpoints, 1..1024), e.g. 8,64,256,1024: ZeroMQ vLLM publishers churning blocks into one kvgate; table of RSS, B/entry, ingest CPU, event lag and decision time, plots in -out")
	var fc bench.FleetConfig
	fs.IntVar(&fc.Entries, "fleet-entries", 0, "fleet: (key, endpoint) entries to reach before measuring, across the fleet, the same at every size; 0: each size N fills 100M x N / 1,024 (97,656 an endpoint: 781k at 8, 100M at 1,024)")
	fs.Float64Var(&fc.EventRate, "fleet-rate", 4, "fleet: churn batches per second per endpoint (each stores 16 blocks and removes the 16 oldest)")
	fs.DurationVar(&fc.Measure, "fleet-measure", 5*time.Second, "fleet: churn window over which ingest CPU is measured")
	fs.IntVar(&fc.Markers, "fleet-markers", 100, "fleet: event-lag markers per fleet size")
	fs.IntVar(&fc.Decisions, "fleet-decisions", 200, "fleet: 8,192-token decision requests per fleet size")
	fs.StringVar(&fc.Publishers, "fleet-pub", "zmtp", "fleet: the engines' PUB sockets: zmtp (kvgate's own load-generation writer: direct writes, never drops) or zmq4 (go-zeromq's, a writer goroutine per socket)")
	fs.StringVar(&fc.ProfileDir, "fleet-profile", "", "fleet: a directory for CPU profiles of each churn window: kvgate-N.prof (kvgate serve) and runner-N.prof (the publishers), N the fleet size; empty: none")
	fs.DurationVar(&fc.LoadScrape, "fleet-load-scrape", 50*time.Millisecond, "fleet: kvgate's -kv-load-scrape (its default; every engine's /metrics read this often, the stub answers vLLM's gauges; 0: off)")
	out := fs.String("out", "bench/out", "directory for report.md and the SVG plots")
	engines := fs.Int("engines", 4, "simulated engines per policy run")
	policies := fs.String("policies", bench.DefaultPolicies, "comma-separated: rr, chwbl, kv-exact (serve -kv-mode 3, every default), kv-exact-overlap, kv-exact-prefix (-kv-policy overlap), oracle, direct-rr (harness round-robin, no kvgate)")
	workload := fs.String("workload", "shared-prefix", "shared-prefix, hot-prefix, rag or trace; a comma-separated list runs each in turn into one report")
	model := fs.String("model", "qwen3", "served model name")
	tokDir := fs.String("tokenizer", defaultTokenizerDir(), "tokenizer directory for the engines and kvgate; \"words\" = one token per word (no kvgate parity)")
	kvgateBin := fs.String("kvgate", "", "kvgate binary to run as the router (default: this executable)")
	var kvArgs repeatable
	fs.Var(&kvArgs, "kvgate-arg", "extra flag passed to kvgate serve (repeatable)")
	progress := fs.Bool("progress", IsTTY(os.Stderr), "draw a progress bar on stderr")
	seed := fs.Uint64("seed", 1, "workload seed")
	plotFmt := fs.String("plot-format", "svg", "plot file format: svg, png or pdf")
	replicas := fs.Int("replicas", 1, "kvgate serve processes per kvgate policy, each subscribed to every engine; clients (sessions) are spread over them round-robin")
	rateScale := fs.String("rate-scale", "1", "load sweep: comma-separated arrival-rate multipliers, e.g. 0.5,1,2,4 (arrival and think times divided by each); one table per level and a TTFT-versus-load plot")

	var sp enginesim.Spec
	fs.StringVar(&sp.Engine, "engine", "vllm", "engine the simulators play: vllm, sglang or trtllm")
	fs.StringVar(&sp.Layout, "event-layout", "array", "vLLM event encoding: array or map")
	fs.IntVar(&sp.BlockSize, "block-size", 16, "engine KV block size")
	fs.StringVar(&sp.HashAlgo, "hash-algo", "sha256", "engine prefix-caching hash algo")
	fs.IntVar(&sp.NumBlocks, "num-blocks", 768, "KV blocks per engine")
	fs.IntVar(&sp.MaxBatch, "max-batch", 8, "requests running at once per engine")
	fs.DurationVar(&sp.PrefillBase, "prefill-base", 5*time.Millisecond, "fixed prefill time")
	fs.DurationVar(&sp.PrefillPerToken, "prefill-per-token", 100*time.Microsecond, "prefill time per uncached token")
	fs.DurationVar(&sp.DecodePerToken, "decode-per-token", 5*time.Millisecond, "decode time per output token")
	fs.BoolVar(&sp.PrefillShared, "prefill-shared", true, "engines share prefill compute among concurrent prefills, as a GPU does (its prefill throughput does not grow with its batch); false: each prefill runs at full rate in parallel")

	var shp bench.SharedPrefix
	fs.IntVar(&shp.SystemPrompts, "system-prompts", 8, "shared-prefix: K system prompts")
	fs.IntVar(&shp.Users, "users", 64, "shared-prefix: M users")
	fs.IntVar(&shp.Turns, "turns", 4, "shared-prefix: turns per user")
	fs.IntVar(&shp.SystemTokens, "system-tokens", 2048, "shared-prefix: words per system prompt")
	fs.IntVar(&shp.TurnTokens, "turn-tokens", 48, "shared-prefix: words per user message")
	fs.DurationVar(&shp.Spread, "spread", 5*time.Second, "arrival window of the sessions")
	fs.DurationVar(&shp.Think, "think", 200*time.Millisecond, "pause between a user's turns")
	maxTokens := fs.Int("max-tokens", 16, "output tokens per request")

	var rag bench.RAG
	fs.IntVar(&rag.Documents, "docs", 32, "rag: shared documents")
	fs.IntVar(&rag.DocTokens, "doc-tokens", 512, "rag: words per document")
	fs.IntVar(&rag.Queries, "queries", 200, "rag: queries")
	fs.IntVar(&rag.DocsPerQuery, "docs-per-query", 3, "rag: documents cited per query")

	var hot bench.HotPrefix
	fs.IntVar(&hot.Prefixes, "hot-prefixes", 6, "hot-prefix: system prompts")
	fs.IntVar(&hot.PrefixTokens[0], "hot-prefix-min-tokens", 300, "hot-prefix: fewest words per system prompt")
	fs.IntVar(&hot.PrefixTokens[1], "hot-prefix-max-tokens", 2000, "hot-prefix: most words per system prompt")
	fs.IntVar(&hot.Requests, "hot-requests", 300, "hot-prefix: requests (Poisson arrivals over -spread)")
	fs.IntVar(&hot.SuffixTokens, "hot-suffix-tokens", 32, "hot-prefix: words per unique user message")
	fs.Float64Var(&hot.Zipf, "zipf", 1.1, "hot-prefix: popularity skew s, prefix k has weight 1/(k+1)^s (0 = uniform)")

	var tr bench.Trace
	fs.StringVar(&tr.Path, "trace", "", "trace: Mooncake JSONL path")
	fs.IntVar(&tr.BlockTokens, "trace-block-tokens", 64, "trace: words per 512-token hash id (prompts shrink by this/512)")
	fs.Float64Var(&tr.TimeScale, "trace-time-scale", 0.05, "trace: arrival time multiplier")
	fs.IntVar(&tr.Limit, "trace-limit", 1000, "trace: first N requests (0 = all)")

	var oh bench.OverheadConfig
	fs.IntVar(&oh.Requests, "overhead-requests", 300, "overhead: sequential requests per prompt size and path")
	fs.DurationVar(&oh.ThroughputFor, "overhead-throughput-for", 3*time.Second, "overhead: duration of each path's req/s measurement per prompt size, taken in rounds of about a second (at least three) that alternate the paths")
	fs.IntVar(&oh.Concurrency, "overhead-concurrency", 8, "overhead: clients in the req/s measurement")
	fs.StringVar(&oh.Nginx, "nginx", "/usr/sbin/nginx", "overhead: nginx binary for the proxy_pass baseline (skipped when absent)")

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bench: unexpected arguments %q\n", fs.Args())
		return 2
	}
	setFlags := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { setFlags[f.Name] = true })
	bin := *kvgateBin
	if bin == "" {
		exe, err := os.Executable()
		if err != nil {
			fmt.Fprintf(stderr, "bench: %v\n", err)
			return 1
		}
		bin = exe
	}
	if *fleet != "" {
		for _, f := range strings.Split(*fleet, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 || n > 1024 {
				fmt.Fprintf(stderr, "bench: -fleet: %q is not a fleet size in 1..1024\n", f)
				return 2
			}
			fc.Sizes = append(fc.Sizes, n)
		}
		if *tokDir == "words" {
			fmt.Fprintln(stderr, "bench: -fleet needs a real -tokenizer directory (kvgate serve loads it)")
			return 2
		}
		for name, bad := range map[string]bool{"-fleet-entries": fc.Entries < 0, "-fleet-rate": fc.EventRate < 0,
			"-fleet-measure": fc.Measure < 0, "-fleet-markers": fc.Markers < 0, "-fleet-decisions": fc.Decisions < 0, "-fleet-load-scrape": fc.LoadScrape < 0} {
			if bad {
				fmt.Fprintf(stderr, "bench: %s must be >= 0\n", name)
				return 2
			}
		}
		if fc.Publishers != "zmtp" && fc.Publishers != "zmq4" {
			fmt.Fprintf(stderr, "bench: -fleet-pub %q: want zmtp or zmq4\n", fc.Publishers)
			return 2
		}
		fc.Kvgate, fc.Model, fc.Tokenizer, fc.Seed = bin, *model, *tokDir, *seed
		if *progress {
			fc.Progress = stderr
		}
		return runFleet(fc, *out, *plotFmt, stdout, stderr)
	}
	sp.Model = *model
	sp.DefaultMaxTokens = *maxTokens
	var enc enginesim.Encoder
	tokenizer := *tokDir
	if tokenizer == "words" {
		enc, tokenizer = enginesim.WordEncoder{}, ""
	} else {
		e, err := enginesim.LoadEncoder(*model, tokenizer)
		if err != nil {
			fmt.Fprintf(stderr, "bench: tokenizer %s: %v (run `make fetch`, or pass -tokenizer)\n", tokenizer, err)
			return 2
		}
		enc = e
	}
	sp.Encoder = enc
	words := bench.FilterWords(enc, bench.Words)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var bar io.Writer
	if *progress {
		bar = stderr
	}

	if *overhead {
		oh.Sim = sp
		oh.Kvgate, oh.Tokenizer, oh.KvgateArgs, oh.Words = bin, tokenizer, kvArgs, words
		oh.Progress = bar
		res, err := bench.RunOverhead(ctx, oh)
		if err != nil {
			fmt.Fprintf(stderr, "bench: overhead: %v\n", err)
			return 1
		}
		res.WriteTable(stdout)
		if len(res.Routes) > 0 {
			fmt.Fprintln(stdout)
			res.WriteRoutes(stdout)
		}
		if len(res.Stages) > 0 {
			fmt.Fprintln(stdout)
			res.WriteStages(stdout)
		}
		if res.Note != "" {
			fmt.Fprintf(stdout, "\n%s\n", res.Note)
		}
		if err := writeFile(filepath.Join(*out, "overhead.md"), func(w io.Writer) { res.WriteReport(w) }); err != nil {
			fmt.Fprintf(stderr, "bench: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "\nreport: %s\n", filepath.Join(*out, "overhead.md"))
		return 0
	}

	scales, err := bench.ParseRateScales(*rateScale)
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 2
	}
	if *replicas < 1 {
		fmt.Fprintf(stderr, "bench: -replicas %d: want 1 or more\n", *replicas)
		return 2
	}
	cfg := bench.Config{Engines: *engines, Sim: sp, Kvgate: bin, Tokenizer: tokenizer, KvgateArgs: kvArgs, Progress: bar, Replicas: *replicas}
	names := strings.Split(*policies, ",")
	kinds := strings.Split(*workload, ",")
	if *demo {
		// Two workloads, each swept over three load levels, sized to finish in about two
		// minutes on 2 cores. Engine pools of 768 blocks (12k tokens) hold about a quarter
		// of the 8 shared-prefix system prompts plus their users' histories, so placement
		// decides what stays cached; on hot-prefix the top prompts fit everywhere, so what
		// decides is whether a router herds onto the one engine that holds the hottest.
		cfg.Engines = 4
		cfg.Sim.NumBlocks = 768
		shp = bench.SharedPrefix{SystemPrompts: 8, Users: 48, Turns: 3, SystemTokens: 2048, TurnTokens: 48,
			Spread: 4 * time.Second, Think: 200 * time.Millisecond}
		hot = bench.HotPrefix{Prefixes: 6, PrefixTokens: [2]int{300, 2000}, Requests: 240, SuffixTokens: 32, Zipf: 1.1}
		kinds = []string{"shared-prefix", "hot-prefix"}
		names = []string{"rr", "chwbl", "kv-exact", "oracle"}
		if !setFlags["rate-scale"] {
			scales = []float64{1, 2, 4}
		}
	}
	for _, n := range names {
		p, ok := bench.PolicyByName(strings.TrimSpace(n))
		if !ok {
			fmt.Fprintf(stderr, "bench: unknown policy %q\n", n)
			return 2
		}
		cfg.Policies = append(cfg.Policies, p)
	}
	shp.Seed, shp.MaxTokens, shp.Words = *seed, *maxTokens, words
	type job struct {
		w   bench.Workload
		sim enginesim.Spec
	}
	var jobs []job
	for _, kind := range kinds {
		j := job{sim: cfg.Sim}
		switch kind = strings.TrimSpace(kind); kind {
		case "shared-prefix":
			j.w = shp.Build()
		case "hot-prefix":
			if hot.Zipf < 0 {
				fmt.Fprintf(stderr, "bench: -zipf %g: want a skew >= 0\n", hot.Zipf)
				return 2
			}
			if hot.Prefixes <= 0 || hot.Requests <= 0 || hot.PrefixTokens[0] <= 0 || hot.PrefixTokens[1] < hot.PrefixTokens[0] {
				fmt.Fprintln(stderr, "bench: -hot-prefixes and -hot-requests must be positive and 0 < -hot-prefix-min-tokens <= -hot-prefix-max-tokens")
				return 2
			}
			hot.Seed, hot.MaxTokens, hot.Words, hot.Window = *seed, *maxTokens, words, shp.Spread
			j.w = hot.Build()
		case "rag":
			rag.Seed, rag.MaxTokens, rag.Words, rag.QueryTokens, rag.Spread = *seed, *maxTokens, words, 32, shp.Spread
			j.w = rag.Build()
		case "trace":
			if tr.Path == "" {
				fmt.Fprintln(stderr, "bench: -workload trace needs -trace PATH (a Mooncake JSONL file)")
				return 2
			}
			tr.MaxTokens, tr.Words = *maxTokens, words
			if !setFlags["num-blocks"] {
				j.sim.NumBlocks = 16384 // trace prompts are long, and conversations return minutes later
			}
			w, err := tr.Build()
			if err != nil {
				fmt.Fprintf(stderr, "bench: %v\n", err)
				return 2
			}
			j.w = w
		default:
			fmt.Fprintf(stderr, "bench: unknown workload %q (want shared-prefix, hot-prefix, rag or trace)\n", kind)
			return 2
		}
		jobs = append(jobs, j)
	}
	if len(cfg.KvgateArgs) > 0 {
		fmt.Fprintf(stdout, "kvgate flags for every kvgate policy: %s\n", strings.Join(cfg.KvgateArgs, " "))
	}
	sweeping := len(scales) > 1 || scales[0] != 1
	start := time.Now()
	var sweeps []*bench.Sweep
	var runErr error
	for _, j := range jobs {
		cfg.Workload, cfg.Sim = j.w, j.sim
		before := func(f float64, w *bench.Workload) {
			rate := ""
			if sweeping {
				rate = ", rate " + bench.LevelName(f)
			}
			fmt.Fprintf(stdout, "workload: %s%s, %d requests over ~%.1fs, %d engines; policies: %s\n",
				w.Name, rate, w.Requests(), w.Span().Seconds(), cfg.Engines, strings.Join(names, ", "))
		}
		after := func(lv *bench.Level) {
			fmt.Fprintln(stdout)
			lv.Result.WriteTable(stdout)
			fmt.Fprintln(stdout)
			lv.Result.WriteTargets(stdout)
		}
		sw, err := bench.RunSweep(ctx, cfg, scales, before, after)
		if err != nil {
			fmt.Fprintf(stderr, "bench: %v\n", err)
			runErr = err
		}
		if len(sw.Levels) > 0 {
			sweeps = append(sweeps, sw)
		}
		if ctx.Err() != nil {
			break
		}
	}
	if len(sweeps) == 0 {
		return 1
	}
	report := filepath.Join(*out, "report.md")
	var plots []string
	var perr, werr error
	if len(sweeps) == 1 && len(sweeps[0].Levels) == 1 && !sweeping {
		res := sweeps[0].Levels[0].Result
		plots, perr = res.WritePlotsAs(*out, *plotFmt)
		werr = writeFile(report, func(w io.Writer) { res.WriteReport(w, "kvgate TTFT benchmark", plots) })
	} else {
		for _, sw := range sweeps {
			if len(sw.Levels) > 1 {
				fmt.Fprintf(stdout, "TTFT versus load, %s:\n\n", sw.Workload)
				sw.WriteLoadTable(stdout)
				fmt.Fprintln(stdout)
			}
		}
		var sp []bench.SweepPlots
		sp, perr = bench.WriteSweepPlots(*out, *plotFmt, sweeps)
		for _, p := range sp {
			if p.Load != "" {
				plots = append(plots, p.Load)
			}
		}
		werr = writeFile(report, func(w io.Writer) { bench.WriteSweepReport(w, "kvgate TTFT benchmark", sweeps, sp) })
	}
	if perr != nil {
		fmt.Fprintf(stderr, "bench: plots: %v\n", perr)
	}
	if werr != nil {
		fmt.Fprintf(stderr, "bench: %v\n", werr)
		return 1
	}
	fmt.Fprintf(stdout, "\nreport: %s (plots: %s) in %.1fs\n", report, strings.Join(plots, ", "), time.Since(start).Seconds())
	if runErr != nil || perr != nil {
		return 1
	}
	return 0
}

// runFleet runs the fleet simulator and prints its table; plots go to out.
func runFleet(fc bench.FleetConfig, out, plotFmt string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	entries := fmt.Sprintf("%d entries", fc.Entries)
	if fc.Entries == 0 {
		entries = fmt.Sprintf("%d x N / 1024 entries", bench.FleetEntriesAt1024)
	}
	fmt.Fprintf(stdout, "fleet: sizes %v, %s, %.1f churn batches/s per endpoint (16 blocks stored, 16 removed), %v CPU window\n\n",
		fc.Sizes, entries, fc.EventRate, fc.Measure)
	start := time.Now()
	rows, err := bench.RunFleet(ctx, fc)
	bench.WriteFleetTable(stdout, rows)
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 1
	}
	plots, err := bench.WriteFleetPlotsAs(out, plotFmt, rows)
	if err != nil {
		fmt.Fprintf(stderr, "bench: plots: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "\nplots: %s in %s (%.0fs)\n", strings.Join(plots, ", "), out, time.Since(start).Seconds())
	return 0
}

func writeFile(path string, write func(io.Writer)) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	write(f)
	return f.Close()
}

// IsTTY reports whether f is a terminal.
func IsTTY(f *os.File) bool { return bench.IsTerminal(f) }
