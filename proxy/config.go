// Package proxy is kvgate's HTTP full proxy: it parses each OpenAI request once, picks
// an endpoint by the rule (rr, chwbl, KV-Exact mode 3 or the mode-1 P/D ladder), relays
// the response unchanged, and exposes its decisions on an admin listener.
package proxy

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/engine"
	"github.com/kvgate/kvgate/hashcore"
	"github.com/kvgate/kvgate/proxy/route"
	"github.com/kvgate/kvgate/shard"
	"github.com/kvgate/kvgate/tokenize"
)

// Engine is the kind of server behind an endpoint; it decides the KV event contract and
// the P/D two-step protocol. The names are package engine's, kept here as aliases.
type Engine = engine.Kind

const (
	EngineVLLM     = engine.VLLM
	EngineSGLang   = engine.SGLang
	EngineTRTLLM   = engine.TRTLLM
	EngineLlamaCpp = engine.LlamaCpp
)

// Role is an endpoint's part in prefill/decode disaggregation.
type Role uint8

const (
	RoleBoth Role = iota
	RolePrefill
	RoleDecode
)

var roleNames = [...]string{"both", "prefill", "decode"}

func (r Role) String() string { return roleNames[r] }

// EndpointSpec is one upstream engine as configured.
type EndpointSpec struct {
	Name   string
	URL    string // http://host:port, no path
	Engine Engine
	Role   Role
	Events string // ZeroMQ PUB address (vLLM/SGLang); empty: no events
	Replay string // ZeroMQ replay ROUTER address
	Topic  string
	DP     int // data-parallel ranks publishing on consecutive ports
	Weight int // chwbl ring weight
	Down   bool
	// BootstrapPort is SGLang's disaggregation bootstrap port on a prefill server.
	BootstrapPort int
	// BlockSize is the engine's block size (vLLM --block-size, SGLang --page-size,
	// TensorRT-LLM tokens_per_block); 0: the rule's -kv-block-size until the engine's
	// events prove another, which is then adopted (a WARN, /debug/inventory).
	BlockSize int
	// Discover (discover=dns) makes this spec a template: the URL's host is a DNS name
	// whose A/AAAA records are the endpoints, each named NAME@ADDRESS with the URL's
	// port and every other option; events= and replay= on the same host follow each
	// address. It is looked up again every -dns-interval (a Kubernetes headless Service
	// works unchanged). An https:// template's endpoints are dialed and verified by
	// address, so their certificates need the pods' IP SANs.
	Discover bool

	host   string // host[:port] from URL
	scheme string // "http" or "https"
}

// Host is the endpoint's host:port.
func (e *EndpointSpec) Host() string { return e.host }

// ParseEndpoint parses one -endpoint value:
// name=..,url=http://host:port,engine=vllm|sglang|trtllm|llamacpp,role=both|prefill|decode,
// events=tcp://..,replay=tcp://..,topic=..,dp=N,weight=W,down=true,bootstrap_port=N,discover=dns.
func ParseEndpoint(s string) (EndpointSpec, error) {
	e := EndpointSpec{Engine: engine.VLLM, DP: 1, Weight: 1}
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return e, fmt.Errorf("%q: want key=value", kv)
		}
		var err error
		switch k {
		case "name":
			e.Name = v
		case "url":
			e.URL = v
		case "engine":
			e.Engine, err = engine.Parse(v)
		case "role":
			switch v {
			case "both":
				e.Role = RoleBoth
			case "prefill":
				e.Role = RolePrefill
			case "decode":
				e.Role = RoleDecode
			default:
				err = fmt.Errorf("role %q: want both, prefill or decode", v)
			}
		case "events":
			e.Events = v
		case "replay":
			e.Replay = v
		case "topic":
			e.Topic = v
		case "dp":
			e.DP, err = atoiRange("dp", v, 1, 256)
		case "block_size":
			e.BlockSize, err = atoiRange("block_size", v, 1, 4096)
		case "weight":
			e.Weight, err = atoiRange("weight", v, 1, 1000)
		case "bootstrap_port":
			e.BootstrapPort, err = atoiRange("bootstrap_port", v, 1, 65535)
		case "down":
			e.Down, err = strconv.ParseBool(v)
		case "discover":
			if v != "dns" {
				err = fmt.Errorf("discover %q: want dns", v)
			}
			e.Discover = true
		default:
			err = fmt.Errorf("unknown key %q", k)
		}
		if err != nil {
			return e, err
		}
	}
	if e.URL == "" {
		return e, errors.New("url= is required")
	}
	u, err := url.Parse(e.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return e, fmt.Errorf("url %q: want http://host:port or https://host:port", e.URL)
	}
	host := u.Host
	if u.Port() == "" {
		port := "80"
		if u.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(u.Hostname(), port)
	}
	e.scheme = u.Scheme
	e.URL = u.Scheme + "://" + host
	e.host = host
	if e.Name == "" {
		e.Name = u.Host
	}
	if e.Discover {
		if _, err := netip.ParseAddr(u.Hostname()); err == nil {
			return e, fmt.Errorf("discover=dns: url %q names an address, not a DNS name", e.URL)
		}
	}
	return e, nil
}

// hostname is the URL's host without its port.
func (e *EndpointSpec) hostname() string {
	h, _, err := net.SplitHostPort(e.host)
	if err != nil {
		return e.host
	}
	return h
}

// at is the endpoint a discover=dns template e names at address a.
func (e *EndpointSpec) at(a netip.Addr) EndpointSpec {
	c := *e
	c.Discover = false
	name := e.hostname()
	_, port, _ := net.SplitHostPort(e.host)
	c.host = net.JoinHostPort(a.String(), port)
	c.URL = c.scheme + "://" + c.host
	c.Name = e.Name + "@" + a.String()
	swap := func(addr string) string {
		rest, ok := strings.CutPrefix(addr, "tcp://")
		if !ok {
			return addr
		}
		if h, p, err := net.SplitHostPort(rest); err == nil && h == name {
			return "tcp://" + net.JoinHostPort(a.String(), p)
		}
		return addr
	}
	c.Events, c.Replay = swap(e.Events), swap(e.Replay)
	return c
}

func atoiRange(what, v string, lo, hi int) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s %q: want an integer in [%d, %d]", what, v, lo, hi)
	}
	return n, nil
}

// ReadEndpointsFile reads one -endpoint value per line; blank lines and # comments
// (whole lines, or after whitespace at a line's end) skip. A bad line or a name given
// twice is an error naming the file and line.
func ReadEndpointsFile(path string) ([]EndpointSpec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	eps, _, err := parseEndpointsFile(path, b)
	return eps, err
}

// TokenizerSpec maps a served model name (and aliases) to a staged tokenizer directory.
type TokenizerSpec struct {
	Model   string
	Dir     string
	Aliases []string
}

// KVMode selects KV-Exact routing.
type KVMode uint8

const (
	KVOff KVMode = iota
	KVConverged
	KVDisaggregated
)

// Selector names the rule's fallback selector.
type Selector uint8

const (
	SelectRR Selector = iota
	SelectCHWBL
)

// Config is one rule: everything `kvgate serve` takes from flags.
type Config struct {
	Listen      string
	AdminListen string
	Endpoints   []EndpointSpec
	// EndpointsFile, when set, is where Endpoints[StaticEndpoints:] came from: it is
	// polled every EndpointsWatch (0: never) and reloaded when its content changes.
	EndpointsFile   string
	StaticEndpoints int
	EndpointsWatch  time.Duration
	// MaxEndpoints is the slot table's size: how many endpoints the fleet can hold at
	// once, those draining included (0: the initial count rounded up to 8, 16, 32 or 64,
	// the inventory's mask widths, which costs no inventory memory).
	MaxEndpoints int
	// DNSInterval is how often discover=dns endpoints are looked up again.
	DNSInterval time.Duration

	Select           Selector
	KVMode           KVMode
	KVBlockSize      int
	KVHashAlgo       string
	KVHashSeed       string
	KVHashSeedSet    bool
	KVKeys           string // auto | engine | rehash
	KVScorePrefix    bool   // false: overlap
	KVMinMatchTokens int
	KVMaxPromptBytes int // prompt / messages JSON bytes above which KV routing is skipped (0: no bound)
	// KVMaxKeysPerEndpoint bounds the block keys the inventory holds for one endpoint, so
	// an event stream that misses removes cannot grow memory forever. At the bound a new
	// key evicts an older one of the same endpoint (kvgate_inventory_evicted_total).
	KVMaxKeysPerEndpoint int
	// PDPrefixTrieKeys bounds, per prefill endpoint, the block keys mode 1's prefix trie
	// remembers of the prompts kvgate sent there (0: no trie tier).
	PDPrefixTrieKeys int
	// LoadFactor is epsilon in the bound ceil((1+epsilon) x mean in-flight). The default 1
	// lets an endpoint take twice the mean before its KV hit goes elsewhere: with a few
	// requests in flight per engine, 0.25 turned most hits away and cost TTFT (bench/RESULTS.md).
	LoadFactor       float64
	CHWBLPrefixBytes int
	// KVPolicy chooses among the endpoints once some holds the prompt's prefix: "cost"
	// (predicted time to first token; the default) or "overlap" (the most matched blocks
	// under the load bound).
	KVPolicy string
	// KVPrefillRate pins every endpoint's prefill rate in tokens/s (0: learned per
	// endpoint from the first tokens kvgate sees, starting from route.PriorRate).
	KVPrefillRate float64
	// KVEngineSlots pins how many requests an engine runs at once (0: learned from the
	// engine's reported running count while requests wait).
	KVEngineSlots int
	// KVLoadScrape is how often each engine's /metrics is read for its running and
	// waiting requests and KV usage (0: never; kvgate's own accounting only).
	KVLoadScrape time.Duration
	// KVTierWeightCPU and KVTierWeightStorage are what a prompt token cached only in host
	// memory, or only on disk / a remote store, costs the cost policy as a fraction of an
	// uncached token's prefill: the engine loads it over a link instead of computing it.
	// 1 means the tier saves nothing: it is not indexed at all. Defaults:
	// DefaultTierWeightCPU, DefaultTierWeightStorage.
	KVTierWeightCPU, KVTierWeightStorage float64
	// KVPendingTTL: in mode 3, a prompt's blocks count as held by the endpoint kvgate sent
	// it to for this long, until the engine's own events report them (0: off).
	KVPendingTTL time.Duration
	// KVFairShare: the cost policy lets no endpoint take more than this times the mean
	// share of recent prefill work, except for requests whose cached prefix there is
	// private (route.Cost); 0 turns the bound off.
	KVFairShare float64
	// TokenizeMemoBytes bounds the memo of token IDs between added tokens that lets a
	// follow-up turn tokenize only its new text (0: off); KVChainMemoBytes bounds the memo
	// of block-key chain stretches that lets it hash only its new blocks (0: off), one
	// memo per contract the endpoints are keyed under (another block size or engine).
	TokenizeMemoBytes int64
	KVChainMemoBytes  int64

	Tokenizers []TokenizerSpec
	LoRA       map[string]string // adapter served name -> base model

	BreakerFailures  int           // consecutive connect failures that open it
	BreakerOpenFor   time.Duration // open period before a half-open trial
	BreakerHalfOpen  int           // trial requests allowed while half-open
	Breaker5xxStreak int           // 0: 5xx do not count

	HealthInterval time.Duration // 0: no active checks
	HealthTimeout  time.Duration
	HealthPath     string

	ConnectTimeout  time.Duration
	UpstreamTimeout time.Duration // until response headers; 504 after
	MaxBodyBytes    int
	MaxHeaderBytes  int // request header limit (hertz answers 431 above)
	MaxRetries      int // 0: up to the number of endpoints
	// Retry5xx: a 5xx answer or a non-streamed body cut short, before any byte reached
	// the client, is dropped and the request sent to another endpoint (the last
	// attempt's answer is relayed as it is).
	Retry5xx bool

	AffinityTTL time.Duration
	AffinityMax int

	ShutdownGrace time.Duration
	// ShutdownDelay is how long, after SIGTERM, /readyz answers 503 while the public
	// listener keeps serving, so balancers take the replica out before it stops accepting.
	ShutdownDelay time.Duration
	// AccessLog writes one INFO line per answered request (endpoint, route, predicted
	// and delivered cached tokens, TTFT, status).
	AccessLog bool

	// TLSCert and TLSKey, when set, serve the public listener over TLS; the files are
	// watched and a renewed pair applies to new connections without a restart.
	TLSCert, TLSKey string
	// UpstreamCA verifies https:// endpoints (system roots when empty); UpstreamCert and
	// UpstreamKey are an optional client certificate kvgate presents to them.
	UpstreamCA, UpstreamCert, UpstreamKey string
	// APIKeysFile, when set, holds the public API keys (one a line, # comments, watched):
	// requests without Authorization: Bearer <one of them> are answered 401.
	APIKeysFile string
	// ForwardAuthorization passes the client's Authorization header to the engine
	// unchanged (the default); false removes it (the engine runs without --api-key).
	ForwardAuthorization bool

	AdminToken string // when set, the admin listener wants Authorization: Bearer <token>

	// Plane is the optional NATS JetStream event plane (plane.go); zero: direct.
	Plane PlaneConfig
}

// DefaultTierWeightCPU and DefaultTierWeightStorage are the tier weights' defaults (the
// rule: prefill rate x KV bytes per token / link bandwidth; README, "Tier weights"): an
// 8B-class model keeps ~144 KiB of KV per token (Qwen3-8B: 36 layers x 8 KV heads x 128
// x 2 (K, V) x 2 bytes) and prefills ~10^4 tokens/s on one GPU (route.PriorRate). PCIe
// Gen4 x16 moves ~25 GB/s host to device: ~170k tokens/s, so loading a token costs
// 10^4/1.7x10^5 = 0.06 of prefilling it. NVMe-class storage reads ~6 GB/s: ~40k
// tokens/s, 0.25.
const (
	DefaultTierWeightCPU     = 0.06
	DefaultTierWeightStorage = 0.25
)

// tiersIndexed says which lower tiers the rule indexes (a weight under 1, KV-Exact on).
func (c *Config) tiersIndexed() (cpu, storage bool) {
	if c.KVMode == KVOff || c.planeRoutes() {
		return false, false // a plane route replica's keys come from the stream: GPU keys only
	}
	return c.KVTierWeightCPU < 1, c.KVTierWeightStorage < 1
}

// Defaults returns a Config with every documented default filled in.
func Defaults() Config {
	return Config{
		Listen:               "127.0.0.1:8080",
		EndpointsWatch:       time.Second,
		DNSInterval:          5 * time.Second,
		AdminListen:          "127.0.0.1:9090",
		KVBlockSize:          16,
		KVKeys:               "auto",
		KVMinMatchTokens:     0,
		KVMaxPromptBytes:     1 << 20,
		KVMaxKeysPerEndpoint: shard.DefaultMaxKeysPerEndpoint,
		PDPrefixTrieKeys:     1 << 18,
		LoadFactor:           1,
		KVPolicy:             "cost",
		KVLoadScrape:         50 * time.Millisecond,
		KVTierWeightCPU:      DefaultTierWeightCPU,
		KVTierWeightStorage:  DefaultTierWeightStorage,
		KVPendingTTL:         2 * time.Second,
		KVFairShare:          route.DefaultFairShare,
		TokenizeMemoBytes:    tokenize.DefaultMemoBytes,
		KVChainMemoBytes:     hashcore.DefaultChainMemoBytes,
		CHWBLPrefixBytes:     256,
		BreakerFailures:      3,
		BreakerOpenFor:       10 * time.Second,
		BreakerHalfOpen:      1,
		HealthInterval:       5 * time.Second,
		HealthTimeout:        2 * time.Second,
		HealthPath:           "/health",
		ConnectTimeout:       2 * time.Second,
		UpstreamTimeout:      300 * time.Second,
		MaxBodyBytes:         32 << 20,
		MaxHeaderBytes:       64 << 10,
		Retry5xx:             true,
		AffinityTTL:          10 * time.Minute,
		AffinityMax:          100000,
		ShutdownGrace:        30 * time.Second,
		ShutdownDelay:        5 * time.Second,
		ForwardAuthorization: true,
	}
}

// FlagError is a refused rule: Flag names the flag to fix.
type FlagError struct {
	Flag string
	Msg  string
}

func (e *FlagError) Error() string { return e.Flag + ": " + e.Msg }

func refuse(flag, format string, a ...any) error {
	return &FlagError{Flag: flag, Msg: fmt.Sprintf(format, a...)}
}

// Validate refuses contradictory or incomplete rules, naming the flag to fix.
func (c *Config) Validate() error {
	if len(c.Endpoints) == 0 {
		return refuse("-endpoint", "at least one endpoint is required (or -endpoints-file)")
	}
	if len(c.Endpoints) > shard.MaxEndpoints {
		return refuse("-endpoint", "%d endpoints: at most %d are supported", len(c.Endpoints), shard.MaxEndpoints)
	}
	if c.MaxEndpoints < 0 || c.MaxEndpoints > shard.MaxEndpoints {
		return refuse("-max-endpoints", "%d: want 0 (the initial count rounded up to 8/16/32/64) or 1..%d", c.MaxEndpoints, shard.MaxEndpoints)
	}
	if c.EndpointsWatch < 0 {
		return refuse("-endpoints-watch", "%v: want >= 0 (0: never reload)", c.EndpointsWatch)
	}
	if c.DNSInterval < 0 {
		return refuse("-dns-interval", "%v: want >= 0 (0: resolve at start and on reloads only)", c.DNSInterval)
	}
	names := map[string]bool{}
	var prefill, decode int
	for i := range c.Endpoints {
		e := &c.Endpoints[i]
		name := e.Name
		if e.host == "" { // built by hand, not by ParseEndpoint: normalize fills it in
			p, err := ParseEndpoint("url=" + e.URL + ",name=" + e.Name)
			if err != nil {
				return refuse("-endpoint", "%s: %v", e.Name, err)
			}
			name = p.Name
		}
		if names[name] {
			return refuse("-endpoint", "name %q is used twice", name)
		}
		names[name] = true
		switch e.Role {
		case RolePrefill:
			prefill++
		case RoleDecode:
			decode++
		}
		if e.Replay != "" && e.Events == "" {
			return refuse("-endpoint", "endpoint %q: replay= without events=", e.Name)
		}
	}
	switch c.KVMode {
	case KVDisaggregated:
		if prefill == 0 || decode == 0 {
			return refuse("-kv-mode", "mode 1 (prefill/decode) needs at least one endpoint with role=prefill and one with role=decode (have %d prefill, %d decode)", prefill, decode)
		}
		var eng Engine // "": none seen yet
		for i := range c.Endpoints {
			e := &c.Endpoints[i]
			if e.Role == RoleBoth {
				return refuse("-endpoint", "endpoint %q: -kv-mode 1 needs role=prefill or role=decode on every endpoint", e.Name)
			}
			if eng != "" && eng != e.Engine {
				return refuse("-endpoint", "endpoint %q: -kv-mode 1 needs one engine kind for the whole P/D pool (%s vs %s)", e.Name, eng, e.Engine)
			}
			eng = e.Engine
		}
	default:
		if prefill > 0 || decode > 0 {
			return refuse("-kv-mode", "endpoints with role=prefill or role=decode need -kv-mode 1")
		}
	}
	if err := c.validatePlane(); err != nil {
		return err
	}
	if c.KVMaxKeysPerEndpoint < 1 {
		return refuse("-kv-max-keys-per-endpoint", "%d: must be >= 1", c.KVMaxKeysPerEndpoint)
	}
	if c.PDPrefixTrieKeys < 0 {
		return refuse("-pd-prefix-trie-keys", "%d: must be >= 0 (0: no prefix trie)", c.PDPrefixTrieKeys)
	}
	if c.KVMode != KVOff {
		for _, e := range c.Endpoints {
			if e.Engine == EngineLlamaCpp {
				return refuse("-kv-mode", "endpoint %q has engine=llamacpp: llama.cpp publishes no KV-cache events, so KV-Exact has no event contract to follow; use -kv-mode off with -select chwbl for prefix affinity", e.Name)
			}
			if e.Engine != EngineTRTLLM && e.Events == "" && !c.planeRoutes() {
				return refuse("-endpoint", "endpoint %q: KV-Exact needs events=tcp://host:port (the engine's KV event publisher)", e.Name)
			}
		}
		if len(c.Tokenizers) == 0 {
			return refuse("-tokenizer", "KV-Exact needs at least one served model mapped to a tokenizer directory (-model NAME -tokenizer DIR)")
		}
		if c.KVBlockSize < 1 || c.KVBlockSize > hashcore.MaxBlockSize {
			return refuse("-kv-block-size", "%d: want 1..%d (the engine's block/page size)", c.KVBlockSize, hashcore.MaxBlockSize)
		}
		if c.KVMinMatchTokens < 0 {
			return refuse("-kv-min-match-tokens", "must be >= 0")
		}
		if c.KVMaxPromptBytes < 0 {
			return refuse("-kv-max-prompt-bytes", "must be >= 0 (0: no bound)")
		}
		switch c.KVKeys {
		case "auto", "engine", "rehash", "fast": // fast: rehash's older name (normalize)
		default:
			return refuse("-kv-keys", "%q: want auto, engine or rehash", c.KVKeys)
		}
		// vLLM and SGLang endpoints in one rule are each keyed under their own engine's
		// contract and block size (proxy/kv.go endpointContract).
	}
	for _, t := range c.Tokenizers {
		if t.Model == "" || t.Dir == "" {
			return refuse("-tokenizer", "want NAME=DIR or -model NAME -tokenizer DIR")
		}
		if st, err := os.Stat(t.Dir); err != nil || !st.IsDir() {
			return refuse("-tokenizer", "%s: not a directory (want the dir holding tokenizer.json)", t.Dir)
		}
	}
	for a, base := range c.LoRA {
		found := false
		for _, t := range c.Tokenizers {
			found = found || t.Model == base || slices.Contains(t.Aliases, base)
		}
		if !found {
			return refuse("-lora", "%s=%s: base model %q has no -tokenizer", a, base, base)
		}
	}
	switch c.KVPolicy {
	case "cost", "overlap":
	default:
		return refuse("-kv-policy", "%q: want cost or overlap", c.KVPolicy)
	}
	if c.KVPrefillRate < 0 || math.IsNaN(c.KVPrefillRate) || math.IsInf(c.KVPrefillRate, 0) {
		return refuse("-kv-prefill-rate", "%v: want tokens/s > 0, or 0 to learn it", c.KVPrefillRate)
	}
	if c.KVEngineSlots < 0 {
		return refuse("-kv-engine-slots", "%d: want >= 0 (0: learn from the engines)", c.KVEngineSlots)
	}
	for _, w := range [...]struct {
		flag string
		v    float64
	}{{"-kv-tier-weight-cpu", c.KVTierWeightCPU}, {"-kv-tier-weight-storage", c.KVTierWeightStorage}} {
		if !(w.v >= 0 && w.v <= 1) {
			return refuse(w.flag, "%v: want a fraction of an uncached token's prefill in [0, 1] (1: the tier is not indexed)", w.v)
		}
	}
	if c.KVLoadScrape < 0 {
		return refuse("-kv-load-scrape", "%v: want >= 0 (0: off)", c.KVLoadScrape)
	}
	if c.TokenizeMemoBytes != 0 && c.TokenizeMemoBytes < tokenize.MinMemoBytes {
		return refuse("-tokenize-memo-bytes", "%d: want 0 (off) or >= %d", c.TokenizeMemoBytes, tokenize.MinMemoBytes)
	}
	if c.KVChainMemoBytes != 0 && c.KVChainMemoBytes < hashcore.MinChainMemoBytes {
		return refuse("-kv-chain-memo-bytes", "%d: want 0 (off) or >= %d", c.KVChainMemoBytes, hashcore.MinChainMemoBytes)
	}
	if c.KVFairShare != 0 && !(c.KVFairShare >= 1 && c.KVFairShare <= 100) {
		return refuse("-kv-fair-share", "%v: want 0 (off) or a factor in [1, 100]", c.KVFairShare)
	}
	if c.KVPendingTTL < 0 {
		return refuse("-kv-pending-ttl", "%v: want >= 0 (0: off)", c.KVPendingTTL)
	}
	if c.LoadFactor < 0 || math.IsNaN(c.LoadFactor) || math.IsInf(c.LoadFactor, 0) {
		return refuse("-kv-load-factor", "%v: want epsilon >= 0", c.LoadFactor)
	}
	if c.BreakerFailures < 1 {
		return refuse("-breaker-failures", "must be >= 1")
	}
	if c.BreakerOpenFor <= 0 {
		return refuse("-breaker-open", "must be > 0")
	}
	if c.BreakerHalfOpen < 1 {
		return refuse("-breaker-half-open", "must be >= 1")
	}
	if c.MaxBodyBytes < 1024 || c.MaxBodyBytes > 1<<30 {
		return refuse("-max-body-bytes", "%d: want 1024..1073741824 (1 GiB)", c.MaxBodyBytes)
	}
	if c.MaxHeaderBytes < 1024 {
		return refuse("-max-header-bytes", "%d: want at least 1024", c.MaxHeaderBytes)
	}
	if c.ConnectTimeout <= 0 {
		return refuse("-connect-timeout", "must be > 0")
	}
	if c.UpstreamTimeout <= 0 {
		return refuse("-upstream-timeout", "must be > 0")
	}
	if c.HealthInterval > 0 && c.HealthTimeout <= 0 {
		return refuse("-health-timeout", "must be > 0")
	}
	if c.CHWBLPrefixBytes < 1 {
		return refuse("-chwbl-prefix-bytes", "must be >= 1")
	}
	if c.AffinityMax < 0 {
		return refuse("-affinity-max", "must be >= 0")
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return refuse("-tls-cert", "the listener's TLS needs both -tls-cert and -tls-key")
	}
	if c.ShutdownDelay < 0 {
		return refuse("-shutdown-delay", "must be >= 0")
	}
	if c.ShutdownGrace < 0 {
		return refuse("-shutdown-grace", "must be >= 0")
	}
	return nil
}

// normalize fills in what Validate accepted in a shorthand: endpoints built by hand
// (a URL and maybe a name, not through ParseEndpoint) get their parsed address, and
// -kv-keys fast becomes rehash. It works on its own copy of the endpoint list. Validate
// must have passed.
func (c *Config) normalize() {
	c.Endpoints = slices.Clone(c.Endpoints)
	for i := range c.Endpoints {
		e := &c.Endpoints[i]
		if e.host == "" {
			p, _ := ParseEndpoint("url=" + e.URL + ",name=" + e.Name)
			e.URL, e.host, e.scheme = p.URL, p.host, p.scheme
			if e.Name == "" {
				e.Name = p.Name
			}
		}
	}
	if c.KVKeys == "fast" {
		c.KVKeys = "rehash"
	}
}
