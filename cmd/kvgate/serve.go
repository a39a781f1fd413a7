package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/cloudwego/hertz/pkg/common/hlog"
	"github.com/cloudwego/netpoll"

	"github.com/kvgate/kvgate/proxy"
	"github.com/kvgate/kvgate/shard"
)

func init() { register("serve", "run the proxy: one rule from flags", runServe) }

// serveFlags parses args into a rule. It is separate from runServe so tests can check
// refusals without listening.
func serveFlags(args []string, stderr io.Writer) (proxy.Config, string, error) {
	r, err := parseServe(args, stderr)
	return r.cfg, r.level, err
}

// serveRule is a parsed rule and every flag's effective value (command line over
// -config), which a SIGHUP's re-read is compared with.
type serveRule struct {
	cfg    proxy.Config
	level  string
	values map[string]string
}

func parseServe(args []string, stderr io.Writer) (serveRule, error) {
	var rule serveRule
	cfg, level, err := parseServeInto(args, stderr, &rule.values)
	rule.cfg, rule.level = cfg, level
	return rule, err
}

// selectorNames and kvModeNames are -select's and -kv-mode's spellings of the rule's
// values (-kv-mode also takes 0 and "" for off).
var (
	selectorNames = [...]string{proxy.SelectRR: "rr", proxy.SelectCHWBL: "chwbl"}
	kvModeNames   = [...]string{proxy.KVOff: "off", proxy.KVConverged: "3", proxy.KVDisaggregated: "1"}
)

// serveFlagGroups orders serve's -h by the part of proxy.Config a flag sets, in the
// parts' order (proxy.Config); the rule file and the log level come last. Every flag is
// in exactly one group (TestServeHelpGroupsEveryFlag).
var serveFlagGroups = []flagGroup{
	{"Listener (public and admin listeners, who may use them)", []string{"listen", "admin-listen", "admin-token", "admin-token-file", "tls-cert", "tls-key", "api-keys-file", "forward-authorization", "access-log"}},
	{"Fleet (the endpoints, and how their list changes at runtime)", []string{"endpoint", "endpoints-file", "endpoints-watch", "max-endpoints", "dns-interval"}},
	{"Select (requests KV-Exact does not place)", []string{"select", "chwbl-prefix-bytes"}},
	{"KV (KV-Exact routing)", []string{"kv-mode", "kv-block-size", "kv-hash-algo", "kv-hash-seed", "kv-keys", "kv-score", "kv-min-match-tokens", "kv-max-prompt-bytes", "kv-max-keys-per-endpoint", "kv-load-factor", "kv-policy", "kv-prefill-rate", "kv-engine-slots", "kv-load-scrape", "kv-tier-weight-cpu", "kv-tier-weight-storage", "kv-pending-ttl", "kv-fair-share", "kv-chain-memo-bytes"}},
	{"Models (served models, tokenizers, LoRA adapters)", []string{"model", "tokenizer", "lora", "tokenize-memo-bytes", "render-memo-bytes"}},
	{"PD (prefill/decode mode 1)", []string{"pd-prefix-trie-keys", "affinity-ttl", "affinity-max"}},
	{"Breaker (per-endpoint circuit breaker)", []string{"breaker-failures", "breaker-open", "breaker-half-open", "breaker-5xx"}},
	{"Health (active health checks)", []string{"health-interval", "health-timeout", "health-path"}},
	{"Upstream (TLS, timeouts and retries towards the engines)", []string{"upstream-ca", "upstream-cert", "upstream-key", "connect-timeout", "upstream-timeout", "max-retries", "retry-5xx"}},
	{"Limits (request size)", []string{"max-body-bytes", "max-header-bytes"}},
	{"Shutdown (drain on SIGTERM)", []string{"shutdown-delay", "shutdown-grace"}},
	{"Plane (optional NATS JetStream event plane)", []string{"events-plane", "plane-role", "nats-url", "plane-stream", "plane-max-age", "plane-max-bytes", "plane-snapshot-interval"}},
	{"Rule file and log", []string{"config", "log-level"}},
}

func parseServeInto(args []string, stderr io.Writer, values *map[string]string) (proxy.Config, string, error) {
	cfg := proxy.Defaults()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: kvgate serve [flags]

Runs one rule: an OpenAI-compatible HTTP proxy in front of a pool of engines.
  kvgate serve -endpoint name=a,url=http://10.0.0.1:8000 -endpoint name=b,url=http://10.0.0.2:8000 -select chwbl
  kvgate serve -kv-mode 3 -kv-hash-algo sha256_cbor -model Qwen/Qwen3-8B -tokenizer /models/qwen3 \
      -endpoint name=a,url=http://10.0.0.1:8000,engine=vllm,events=tcp://10.0.0.1:5557
Contradictory or incomplete rules are refused at start, naming the flag to fix.
Bad input (OpenAI-style error bodies): malformed JSON 400, body over -max-body-bytes 413,
headers over -max-header-bytes 431, Content-Length with Transfer-Encoding 400, a transfer
coding other than chunked 501, no healthy endpoint 503, unreachable 502, upstream timeout
504; every answer, fault and limit is listed in bench/RELIABILITY.md.
`)
		printFlagGroups(stderr, fs, serveFlagGroups)
	}
	// Every default is cfg's, that is proxy.Defaults(); the flags are registered by part,
	// in serveFlagGroups' order.
	var endpoints, models, tokenizers, loras repeatable
	var adminTokenFile, endpointsFile, configFile string
	sel, kvMode := selectorNames[cfg.Select.Kind], kvModeNames[cfg.KV.Mode]
	kvScore := shard.Overlap.String()
	if cfg.KV.ScorePrefix {
		kvScore = shard.Prefix.String()
	}
	logLevel := "info"

	// Listener.
	fs.StringVar(&cfg.Listener.Addr, "listen", cfg.Listener.Addr, "public listener address (OpenAI API)")
	fs.StringVar(&cfg.Listener.AdminAddr, "admin-listen", cfg.Listener.AdminAddr, "admin listener address (/metrics, /debug/*, /healthz, /readyz, /admin/*); empty disables it")
	fs.StringVar(&cfg.Listener.AdminToken, "admin-token", cfg.Listener.AdminToken, "when set, admin requests need 'Authorization: Bearer <token>' (except /healthz, /readyz); visible in the process list: prefer -admin-token-file (default none)")
	fs.StringVar(&adminTokenFile, "admin-token-file", "", "file holding the admin token (surrounding whitespace trimmed) (default none)")
	fs.StringVar(&cfg.Listener.TLSCert, "tls-cert", cfg.Listener.TLSCert, "PEM certificate (chain) for the public listener; with -tls-key it serves HTTPS, and a renewed file applies within a second without a restart (default none: plain HTTP)")
	fs.StringVar(&cfg.Listener.TLSKey, "tls-key", cfg.Listener.TLSKey, "PEM private key for -tls-cert (default none)")
	fs.StringVar(&cfg.Listener.APIKeysFile, "api-keys-file", cfg.Listener.APIKeysFile, "file of public API keys, one a line (# comments), watched for changes: requests without 'Authorization: Bearer <key>' get 401 (default none: no key needed)")
	fs.BoolVar(&cfg.Listener.ForwardAuthorization, "forward-authorization", cfg.Listener.ForwardAuthorization, "pass the client's Authorization header to the engine unchanged (false: remove it)")
	fs.BoolVar(&cfg.Listener.AccessLog, "access-log", cfg.Listener.AccessLog, "log one INFO line per answered request: request_id, path, endpoint, route, status, predicted and delivered cached tokens, ttft_ms, duration_ms (default off)")

	// Fleet.
	fs.Var(&endpoints, "endpoint", "upstream engine, repeatable: name=..,url=http://host:port,engine=vllm|sglang|trtllm|llamacpp,role=both|prefill|decode,events=tcp://host:5557,replay=tcp://host:5558,topic=..,dp=N,weight=W,down=true,bootstrap_port=N,block_size=N,discover=dns (dp: data-parallel ranks, events on port+rank, X-Data-Parallel-Rank on routed requests; block_size: the engine's block/page size, pinned; unset it is adopted from the events; discover=dns: see -dns-interval) (default none)")
	fs.StringVar(&endpointsFile, "endpoints-file", cfg.Fleet.EndpointsFile, "file with one -endpoint value per line (# comments), polled every -endpoints-watch: a changed file adds, removes and changes endpoints without a restart (unchanged ones keep their inventory); a file that does not parse or validate is refused whole with a WARN naming the line (default none)")
	fs.DurationVar(&cfg.Fleet.EndpointsWatch, "endpoints-watch", cfg.Fleet.EndpointsWatch, "how often -endpoints-file is polled; its content hash decides a change, so it works on every filesystem, on same-size rewrites and on Kubernetes ConfigMap symlink swaps (0: read at start and on SIGHUP only)")
	fs.IntVar(&cfg.Fleet.MaxEndpoints, "max-endpoints", cfg.Fleet.MaxEndpoints, "slots for endpoints, draining ones included: how large the fleet may grow at runtime (default 0: the initial count rounded up to 8, 16, 32 or 64, which costs no inventory memory)")
	fs.DurationVar(&cfg.Fleet.DNSInterval, "dns-interval", cfg.Fleet.DNSInterval, "how often discover=dns endpoints (an -endpoint with discover=dns: its URL's host is a DNS name whose A/AAAA records are the endpoints, e.g. a Kubernetes headless Service) are looked up again; a failed lookup keeps the last answer (0: at start and on reloads only)")

	// Select.
	fs.StringVar(&sel, "select", sel, "selector for non-KV routing and KV misses: rr | chwbl")
	fs.IntVar(&cfg.Select.CHWBLPrefixBytes, "chwbl-prefix-bytes", cfg.Select.CHWBLPrefixBytes, "bytes of the system message / prompt in the chwbl key")

	// KV.
	fs.StringVar(&kvMode, "kv-mode", kvMode, "KV-Exact routing: off | 3 (converged pool) | 1 (prefill/decode)")
	fs.IntVar(&cfg.KV.BlockSize, "kv-block-size", cfg.KV.BlockSize, "engine block size in tokens (SGLang: page size)")
	fs.StringVar(&cfg.KV.HashAlgo, "kv-hash-algo", cfg.KV.HashAlgo, "vLLM --prefix-caching-hash-algo: sha256 | sha256_cbor | xxhash | xxhash_cbor (default none: the engine's default, sha256; SGLang: sha256)")
	fs.StringVar(&cfg.KV.HashSeed, "kv-hash-seed", cfg.KV.HashSeed, "the engines' PYTHONHASHSEED (default unset: omit when the engines run without it)")
	fs.StringVar(&cfg.KV.Keys, "kv-keys", cfg.KV.Keys, "which keys to match: auto (engine keys while parity holds, kvgate's re-hashed keys otherwise) | engine | rehash (always re-hash events' token_ids into kvgate's fast keys)")
	fs.StringVar(&kvScore, "kv-score", kvScore, "scoring: overlap (matching blocks) | prefix (leading run)")
	fs.IntVar(&cfg.KV.MinMatchTokens, "kv-min-match-tokens", cfg.KV.MinMatchTokens, "a KV hit below this many matched tokens is a miss (shallow) (default 0: any match counts)")
	fs.IntVar(&cfg.KV.MaxPromptBytes, "kv-max-prompt-bytes", cfg.KV.MaxPromptBytes, "prompt or messages JSON above this many bytes is not tokenized: routed by -select as kv-miss:too_long (bounds per-request CPU and memory; 1 MiB is ~250k tokens; 0: no bound)")
	fs.IntVar(&cfg.KV.MaxKeysPerEndpoint, "kv-max-keys-per-endpoint", cfg.KV.MaxKeysPerEndpoint, "block keys the inventory holds per endpoint at most (4x a large vLLM pool's 1M blocks; 1-byte masks: ~10-20 MiB per 1M keys): at the bound a new key evicts an older one of the same endpoint, counted in kvgate_inventory_evicted_total, so an event stream that misses removes cannot grow memory forever")
	fs.Float64Var(&cfg.KV.LoadFactor, "kv-load-factor", cfg.KV.LoadFactor, "bounded-load epsilon: an endpoint above ceil((1+eps) x mean in-flight) is skipped (KV winner and chwbl)")
	fs.StringVar(&cfg.KV.Policy, "kv-policy", cfg.KV.Policy, "KV-Exact choice among endpoints once one holds the prompt: cost (least predicted time to first token: queued prefill + uncached tokens at the endpoint's prefill rate + wait for a batch slot) | overlap (most matched blocks under -kv-load-factor)")
	fs.Float64Var(&cfg.KV.PrefillRate, "kv-prefill-rate", cfg.KV.PrefillRate, "pin every endpoint's prefill rate in tokens/s for the cost policy (default 0: learned per endpoint from observed first tokens)")
	fs.IntVar(&cfg.KV.EngineSlots, "kv-engine-slots", cfg.KV.EngineSlots, "pin how many requests each engine runs at once (default 0: learned from its /metrics running count while requests wait)")
	fs.DurationVar(&cfg.KV.LoadScrape, "kv-load-scrape", cfg.KV.LoadScrape, "interval of reading each engine's /metrics (running, waiting, KV usage) for the cost policy and the decode choice; a report older than 3 intervals decays to kvgate's own accounting (0: off)")
	fs.Float64Var(&cfg.KV.TierWeightCPU, "kv-tier-weight-cpu", cfg.KV.TierWeightCPU, "cost of a prompt token an engine holds only in host memory (vLLM medium CPU, SGLang CPU_PINNED) as a fraction of an uncached token's prefill: it is loaded over PCIe, not computed (1: CPU blocks are not indexed)")
	fs.Float64Var(&cfg.KV.TierWeightStorage, "kv-tier-weight-storage", cfg.KV.TierWeightStorage, "the same for a token held only on disk or a remote store (vLLM STORAGE, SGLang DISK/EXTERNAL, a connector's own tier) (1: not indexed)")
	fs.DurationVar(&cfg.KV.PendingTTL, "kv-pending-ttl", cfg.KV.PendingTTL, "mode 3: a prompt's blocks count as held where kvgate sent it for this long, until the engine's events report them, so a burst sharing a new prefix sees the first placement (0: off)")
	fs.Float64Var(&cfg.KV.FairShare, "kv-fair-share", cfg.KV.FairShare, "cost policy: no endpoint takes more than this times the mean share of the last minute's prefill work, except requests whose cached prefix there is private (0: off; the bounded-loads factor)")
	fs.Int64Var(&cfg.KV.ChainMemoBytes, "kv-chain-memo-bytes", cfg.KV.ChainMemoBytes, "memory bound of the memo of block-key chain stretches, so a follow-up turn hashes only its new blocks (exact; 0: off)")

	// Models.
	fs.Var(&models, "model", "served model name for the -tokenizer of the same position; NAME[,ALIAS...] (repeatable) (default none)")
	fs.Var(&tokenizers, "tokenizer", "tokenizer directory (holding tokenizer.json): DIR paired with -model, or NAME=DIR (repeatable) (default none)")
	fs.Var(&loras, "lora", "LoRA adapter served name and its base model: ADAPTER=BASE (repeatable) (default none)")
	fs.Int64Var(&cfg.Models.RenderMemoBytes, "render-memo-bytes", cfg.Models.RenderMemoBytes, "memory bound of the memo of chat template loop iterations and bound messages, so a follow-up turn's render evaluates only its new turns (exact: a replay re-checks every value the iteration read; 0: off)")
	fs.Int64Var(&cfg.Models.TokenizeMemoBytes, "tokenize-memo-bytes", cfg.Models.TokenizeMemoBytes, "memory bound of the memo of token IDs between a chat's special tokens, so a follow-up turn tokenizes only its new text (exact by construction; 0: off)")

	// PD.
	fs.IntVar(&cfg.PD.PrefixTrieKeys, "pd-prefix-trie-keys", cfg.PD.PrefixTrieKeys, "mode 1: block keys of the prompts sent to each prefill endpoint that kvgate remembers (its prefix trie, 262144 blocks = 4M tokens of 16), so requests sharing a prefix follow it before the engine's events report it: the ladder tier after KV-Exact (route prefix-trie); 0: off")
	fs.DurationVar(&cfg.PD.AffinityTTL, "affinity-ttl", cfg.PD.AffinityTTL, "mode 1 session affinity lifetime")
	fs.IntVar(&cfg.PD.AffinityMax, "affinity-max", cfg.PD.AffinityMax, "mode 1 session affinity entries (LRU beyond; 0 disables)")

	// Breaker.
	fs.IntVar(&cfg.Breaker.Failures, "breaker-failures", cfg.Breaker.Failures, "consecutive connect failures that open an endpoint's circuit breaker")
	fs.DurationVar(&cfg.Breaker.OpenFor, "breaker-open", cfg.Breaker.OpenFor, "how long an open breaker stays open before half-open trials")
	fs.IntVar(&cfg.Breaker.HalfOpen, "breaker-half-open", cfg.Breaker.HalfOpen, "trial requests allowed while half-open")
	fs.IntVar(&cfg.Breaker.Streak5xx, "breaker-5xx", cfg.Breaker.Streak5xx, "consecutive 5xx answers that open the breaker (default 0: 5xx never open it)")

	// Health.
	fs.DurationVar(&cfg.Health.Interval, "health-interval", cfg.Health.Interval, "active health check interval (0 disables)")
	fs.DurationVar(&cfg.Health.Timeout, "health-timeout", cfg.Health.Timeout, "active health check timeout")
	fs.StringVar(&cfg.Health.Path, "health-path", cfg.Health.Path, "active health check path")

	// Upstream.
	fs.StringVar(&cfg.Upstream.CA, "upstream-ca", cfg.Upstream.CA, "PEM CA bundle that verifies https:// endpoints (default none: the system roots)")
	fs.StringVar(&cfg.Upstream.Cert, "upstream-cert", cfg.Upstream.Cert, "PEM client certificate kvgate presents to https:// endpoints, with -upstream-key (default none)")
	fs.StringVar(&cfg.Upstream.Key, "upstream-key", cfg.Upstream.Key, "PEM private key for -upstream-cert (default none)")
	fs.DurationVar(&cfg.Upstream.ConnectTimeout, "connect-timeout", cfg.Upstream.ConnectTimeout, "upstream connect timeout (a failure retries on the next-best endpoint)")
	fs.DurationVar(&cfg.Upstream.Timeout, "upstream-timeout", cfg.Upstream.Timeout, "max wait for upstream response headers and between streamed reads (504 after)")
	fs.IntVar(&cfg.Upstream.MaxRetries, "max-retries", cfg.Upstream.MaxRetries, "retries after connect failures (default 0: up to the number of endpoints)")
	fs.BoolVar(&cfg.Upstream.Retry5xx, "retry-5xx", cfg.Upstream.Retry5xx, "retry a 5xx answer, or a non-streamed body the engine cut short, on another endpoint while nothing reached the client (the last attempt's answer is relayed)")

	// Limits.
	fs.IntVar(&cfg.Limits.MaxBodyBytes, "max-body-bytes", cfg.Limits.MaxBodyBytes, "request body limit, up to 1 GiB (413 above; a declared Content-Length above it is refused after at most 8 KiB is read, and the connection closed)")
	fs.IntVar(&cfg.Limits.MaxHeaderBytes, "max-header-bytes", cfg.Limits.MaxHeaderBytes, "request header limit in bytes, request line included (431 above)")

	// Shutdown.
	fs.DurationVar(&cfg.Shutdown.Delay, "shutdown-delay", cfg.Shutdown.Delay, "on SIGINT/SIGTERM, how long /readyz answers 503 while the public listener still serves, so balancers stop sending before it stops accepting (a second signal exits at once)")
	fs.DurationVar(&cfg.Shutdown.Grace, "shutdown-grace", cfg.Shutdown.Grace, "after the drain delay, how long in-flight requests and streams may finish once the listener stops accepting")

	// Plane: the optional event plane (package ingest/plane).
	fs.StringVar(&cfg.Plane.Kind, "events-plane", cfg.Plane.Kind, "how replicas learn the engines' KV events: direct (each replica subscribes to every engine) | jetstream (a NATS JetStream stream of normalized events and snapshots, for a TensorRT-LLM drain shared by replicas, warm restarts, many replicas)")
	fs.StringVar(&cfg.Plane.Role, "plane-role", cfg.Plane.Role, "with -events-plane jetstream: ingest (follow the engines, publish what is applied, route on it) | route (follow the plane only; endpoints need no events=, and one given events= is followed directly while the plane is down) | both (as ingest) (default both)")
	fs.StringVar(&cfg.Plane.NATSURL, "nats-url", cfg.Plane.NATSURL, "with -events-plane jetstream: NATS server(s), nats://host:4222[,nats://...] (default none)")
	fs.StringVar(&cfg.Plane.Stream, "plane-stream", cfg.Plane.Stream, "JetStream stream of the event plane (subjects kvgate.kv.<endpoint>.*)")
	fs.DurationVar(&cfg.Plane.MaxAge, "plane-max-age", cfg.Plane.MaxAge, "stream retention by age: at least twice -plane-snapshot-interval, so the newest snapshot and the events behind it stay")
	fs.Int64Var(&cfg.Plane.MaxBytes, "plane-max-bytes", cfg.Plane.MaxBytes, "stream retention by size, oldest first (16 endpoints of 1M keys write 128 MiB of snapshots per interval)")
	fs.DurationVar(&cfg.Plane.SnapshotInterval, "plane-snapshot-interval", cfg.Plane.SnapshotInterval, "ingest replicas snapshot each endpoint's inventory this often: a restarted route replica replays at most this much of the stream; route replicas call an endpoint stale after 3 intervals of silence")

	// The rule file and the process's log.
	fs.StringVar(&configFile, "config", "", "rule file: one 'flag = value' per line (any serve flag without its dash; repeatable flags repeat; # comments); flags on the command line override it (default none)")
	fs.StringVar(&logLevel, "log-level", logLevel, "debug | info | warn | error")
	if err := fs.Parse(args); err != nil {
		return cfg, "", err
	}
	if fs.NArg() > 0 {
		return cfg, "", fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if configFile != "" {
		if err := applyConfigFile(fs, configFile); err != nil {
			return cfg, "", &proxy.FlagError{Flag: "-config", Msg: err.Error()}
		}
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "kv-hash-seed" {
			cfg.KV.HashSeedSet = true
		}
	})
	*values = map[string]string{}
	fs.VisitAll(func(f *flag.Flag) { (*values)[f.Name] = f.Value.String() })
	if adminTokenFile != "" {
		if cfg.Listener.AdminToken != "" {
			return cfg, "", &proxy.FlagError{Flag: "-admin-token-file", Msg: "give -admin-token or -admin-token-file, not both"}
		}
		b, err := os.ReadFile(adminTokenFile)
		if err != nil {
			return cfg, "", &proxy.FlagError{Flag: "-admin-token-file", Msg: err.Error()}
		}
		if cfg.Listener.AdminToken = strings.TrimSpace(string(b)); cfg.Listener.AdminToken == "" {
			return cfg, "", &proxy.FlagError{Flag: "-admin-token-file", Msg: adminTokenFile + " is empty"}
		}
	}
	for _, e := range endpoints {
		sp, err := proxy.ParseEndpoint(e)
		if err != nil {
			return cfg, "", &proxy.FlagError{Flag: "-endpoint", Msg: err.Error()}
		}
		cfg.Fleet.Endpoints = append(cfg.Fleet.Endpoints, sp)
	}
	if endpointsFile != "" {
		eps, err := proxy.ReadEndpointsFile(endpointsFile)
		if err != nil {
			return cfg, "", &proxy.FlagError{Flag: "-endpoints-file", Msg: err.Error()}
		}
		cfg.Fleet.EndpointsFile, cfg.Fleet.StaticEndpoints = endpointsFile, len(cfg.Fleet.Endpoints)
		cfg.Fleet.Endpoints = append(cfg.Fleet.Endpoints, eps...)
	}
	selIdx := slices.Index(selectorNames[:], sel)
	if selIdx < 0 {
		return cfg, "", &proxy.FlagError{Flag: "-select", Msg: fmt.Sprintf("%q: want rr or chwbl", sel)}
	}
	cfg.Select.Kind = proxy.Selector(selIdx)
	if kvMode == "0" || kvMode == "" {
		kvMode = kvModeNames[proxy.KVOff]
	}
	modeIdx := slices.Index(kvModeNames[:], kvMode)
	if modeIdx < 0 {
		return cfg, "", &proxy.FlagError{Flag: "-kv-mode", Msg: fmt.Sprintf("%q: want off, 3 or 1", kvMode)}
	}
	cfg.KV.Mode = proxy.KVMode(modeIdx)
	score, ok := shard.ParseMode(kvScore)
	if !ok {
		return cfg, "", &proxy.FlagError{Flag: "-kv-score", Msg: fmt.Sprintf("%q: want overlap or prefix", kvScore)}
	}
	cfg.KV.ScorePrefix = score == shard.Prefix
	bare := 0
	for _, t := range tokenizers {
		if name, dir, ok := strings.Cut(t, "="); ok {
			cfg.Models.Tokenizers = append(cfg.Models.Tokenizers, proxy.TokenizerSpec{Model: name, Dir: dir})
			continue
		}
		if bare >= len(models) {
			return cfg, "", &proxy.FlagError{Flag: "-tokenizer", Msg: fmt.Sprintf("%s: no -model names it (use -model NAME -tokenizer DIR or -tokenizer NAME=DIR)", t)}
		}
		names := strings.Split(models[bare], ",")
		cfg.Models.Tokenizers = append(cfg.Models.Tokenizers, proxy.TokenizerSpec{Model: names[0], Dir: t, Aliases: names[1:]})
		bare++
	}
	if bare < len(models) {
		return cfg, "", &proxy.FlagError{Flag: "-model", Msg: fmt.Sprintf("%q has no -tokenizer DIR", models[bare])}
	}
	for _, l := range loras {
		a, base, ok := strings.Cut(l, "=")
		if !ok || a == "" || base == "" {
			return cfg, "", &proxy.FlagError{Flag: "-lora", Msg: fmt.Sprintf("%q: want ADAPTER=BASE", l)}
		}
		if cfg.Models.LoRA == nil {
			cfg.Models.LoRA = map[string]string{}
		}
		cfg.Models.LoRA[a] = base
	}
	if err := cfg.Validate(); err != nil {
		return cfg, "", err
	}
	return cfg, logLevel, nil
}

func runServe(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	rule, err := parseServe(args, stderr)
	cfg, level := rule.cfg, rule.level
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "kvgate serve:", err)
		return 2
	}
	var lv slog.LevelVar
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		fmt.Fprintln(stderr, "kvgate serve: -log-level:", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: &lv}))
	// hertz logs through its own logger: keep warnings and errors, as slog records.
	hlog.SetLevel(hlog.LevelWarn)
	hlog.SetOutput(slogWriter{log})
	netpoll.SetLoggerOutput(slogWriter{log})

	s, err := proxy.New(cfg, proxy.Options{Logger: log})
	if err != nil {
		fmt.Fprintln(stderr, "kvgate serve:", err)
		var fe *proxy.FlagError
		if errors.As(err, &fe) {
			return 2
		}
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := s.Start(ctx); err != nil {
		fmt.Fprintln(stderr, "kvgate serve:", err)
		return 1
	}
	log.Info("kvgate serving", "listen", s.PublicAddr(), "admin", s.AdminAddr(), "endpoints", len(cfg.Fleet.Endpoints))
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-hup:
			reloadRule(args, &rule, s, &lv, log)
		}
	}
	stop() // from here a second SIGINT/SIGTERM ends the process at once
	s.BeginDrain()
	time.Sleep(cfg.Shutdown.Delay)
	log.Info("shutting down: listener closed, draining in-flight requests", "grace", cfg.Shutdown.Grace)
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Shutdown.Grace+time.Second)
	defer cancel()
	if err := s.Shutdown(sctx); err != nil {
		log.Warn("shutdown", "err", err)
	}
	log.Info("kvgate stopped")
	return 0
}

// liveFlags change on SIGHUP; every other flag needs a restart. -endpoints-file's
// content is re-read (its path is fixed), -api-keys-file and the TLS files are watched
// on their own.
var liveFlags = map[string]bool{"endpoint": true, "log-level": true, "access-log": true,
	"admin-token": true, "admin-token-file": true, "config": true}

// reloadRule re-reads the rule (command line and -config) on SIGHUP and applies what can
// change live: endpoints (the fleet's change path: refused whole if they do not
// validate), log level, access log, admin token. Changed flags that cannot change live
// are named in a WARN and keep their running values. A rule that does not parse or
// validate changes nothing.
func reloadRule(args []string, cur *serveRule, s *proxy.Server, lv *slog.LevelVar, log *slog.Logger) {
	var msg strings.Builder
	next, err := parseServe(args, &msg)
	if err != nil {
		log.Warn("SIGHUP: the rule does not parse or validate: keeping the running rule", "err", err, "detail", strings.TrimSpace(msg.String()))
		return
	}
	var fixed []string
	for name, v := range next.values {
		if cur.values[name] != v && !liveFlags[name] {
			fixed = append(fixed, "-"+name)
		}
	}
	slices.Sort(fixed)
	if len(fixed) > 0 {
		log.Warn("SIGHUP: these flags change only with a restart: left as they were", "flags", strings.Join(fixed, " "))
	}
	static := next.cfg.Fleet.Endpoints
	if next.cfg.Fleet.EndpointsFile != "" {
		static = static[:next.cfg.Fleet.StaticEndpoints]
	}
	var applied []string
	if err := s.ReloadEndpoints(static); err != nil {
		log.Warn("SIGHUP: endpoints refused: keeping the running endpoints", "err", err)
	} else {
		applied = append(applied, "endpoints")
	}
	if next.level != cur.level {
		var l slog.Level
		if err := l.UnmarshalText([]byte(next.level)); err != nil {
			log.Warn("SIGHUP: -log-level refused: keeping the running level", "err", err)
			next.level = cur.level
		} else {
			lv.Set(l)
			applied = append(applied, "log-level="+next.level)
		}
	}
	if next.cfg.Listener.AccessLog != cur.cfg.Listener.AccessLog {
		s.SetAccessLog(next.cfg.Listener.AccessLog)
		applied = append(applied, fmt.Sprintf("access-log=%v", next.cfg.Listener.AccessLog))
	}
	if next.cfg.Listener.AdminToken != cur.cfg.Listener.AdminToken {
		s.SetAdminToken(next.cfg.Listener.AdminToken)
		applied = append(applied, "admin-token")
	}
	log.Info("SIGHUP: rule reloaded", "applied", strings.Join(applied, " "))
	// What did not apply stays the running value, so the next SIGHUP names it again.
	for _, f := range fixed {
		next.values[f[1:]] = cur.values[f[1:]]
	}
	next.cfg = mergeLive(cur.cfg, next.cfg)
	*cur = next
}

// mergeLive is the running rule after a reload: cur with next's live settings.
func mergeLive(cur, next proxy.Config) proxy.Config {
	cur.Listener.AccessLog, cur.Listener.AdminToken = next.Listener.AccessLog, next.Listener.AdminToken
	return cur
}

// slogWriter turns hertz's log lines into slog warnings.
type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.log.Warn("hertz", "msg", strings.TrimSpace(string(p)))
	return len(p), nil
}

// applyConfigFile sets every flag the file names and the command line did not: the
// command line overrides the file, a repeatable flag given on the command line
// replaces the file's values rather than adding to them.
func applyConfigFile(fs *flag.FlagSet, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	onCmdLine := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCmdLine[f.Name] = true })
	for i, raw := range strings.Split(string(b), "\n") {
		line := strings.TrimSpace(raw)
		if line == "" || line[0] == '#' {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			return fmt.Errorf("%s:%d: want 'flag = value'", path, i+1)
		}
		name = strings.TrimLeft(strings.TrimSpace(name), "-")
		value = strings.TrimSpace(value)
		if len(value) >= 2 && value[0] == '"' && value[len(value)-1] == '"' {
			value = value[1 : len(value)-1]
		}
		f := fs.Lookup(name)
		switch {
		case f == nil:
			return fmt.Errorf("%s:%d: no flag -%s (see kvgate serve -h)", path, i+1, name)
		case name == "config":
			return fmt.Errorf("%s:%d: a config file cannot name another", path, i+1)
		case onCmdLine[name]:
			continue
		}
		if err := fs.Set(name, value); err != nil {
			return fmt.Errorf("%s:%d: -%s: %v", path, i+1, name, err)
		}
	}
	return nil
}
