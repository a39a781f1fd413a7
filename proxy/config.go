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
	"github.com/kvgate/kvgate/ingest/plane"
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
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || (u.Path != "" && u.Path != "/") {
		return e, fmt.Errorf("url %q: want http://host:port or https://host:port", e.URL)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return e, fmt.Errorf("url %q: port %s: want 1..65535", e.URL, p)
		}
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
	if i := strings.IndexFunc(e.Name, func(r rune) bool { return r == '"' || r == '\\' || r < 0x20 || r == 0x7f }); i >= 0 {
		// A name labels the endpoint's metrics, where such characters are escaped away
		// ('_'): two endpoints would share their series.
		return e, fmt.Errorf("name %q: no quotes, backslashes or control characters (it labels metrics)", e.Name)
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

// checkEventAddrs refuses a vLLM or SGLang endpoint's events= or replay= its subscriber
// could not dial. Checked with the rule, not when the subscriber starts: an endpoint
// added at runtime would otherwise join the fleet without one (an ERROR in the log only).
func (e *EndpointSpec) checkEventAddrs() error {
	if e.Engine != EngineVLLM && e.Engine != EngineSGLang {
		return nil // TensorRT-LLM's events come from its URL
	}
	for _, a := range [...]struct{ key, v string }{{"events", e.Events}, {"replay", e.Replay}} {
		if a.v == "" {
			continue
		}
		rest, ok := strings.CutPrefix(a.v, "tcp://")
		h, p, err := net.SplitHostPort(rest)
		port, perr := strconv.Atoi(p)
		if !ok || err != nil || h == "" || h == "*" || perr != nil || port < 1 || port+max(e.DP, 1)-1 > 65535 {
			return fmt.Errorf("%s=%s: want tcp://host:port, the engine's host (not a wildcard) and a port in 1..65535 (dp ranks on the ports after it)", a.key, a.v)
		}
	}
	return nil
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

// Config is one rule: everything `kvgate serve` takes from flags, in parts by what they
// configure. The parts, in the order `kvgate serve -h` lists their flags: Listener (the
// public and admin listeners and who may use them), Fleet (which endpoints, and how the
// list changes at runtime), Select (the selector for requests KV-Exact does not place),
// KV (KV-Exact routing: every -kv-* knob), Models (served models, their tokenizers and
// LoRA adapters), PD (what only prefill/decode mode 1 uses), Breaker, Health, Upstream
// (how kvgate reaches the engines: TLS, timeouts, retries), Limits (request size),
// Shutdown and Plane (the optional event plane).
type Config struct {
	Listener ListenerConfig
	Fleet    FleetConfig
	Select   SelectConfig
	KV       KVConfig
	Models   ModelsConfig
	PD       PDConfig
	Breaker  BreakerConfig
	Health   HealthConfig
	Upstream UpstreamConfig
	Limits   LimitsConfig
	Shutdown ShutdownConfig
	// Plane is the optional NATS JetStream event plane (plane.go); zero: direct.
	Plane PlaneConfig
}

// ListenerConfig is the public (OpenAI API) and admin listeners and who may use them.
type ListenerConfig struct {
	Addr      string // public listener address
	AdminAddr string // admin listener address; empty: none
	// AdminToken, when set, makes the admin listener want Authorization: Bearer <token>.
	AdminToken string
	// TLSCert and TLSKey, when set, serve the public listener over TLS; the files are
	// watched and a renewed pair applies to new connections without a restart.
	TLSCert, TLSKey string
	// APIKeysFile, when set, holds the public API keys (one a line, # comments, watched):
	// requests without Authorization: Bearer <one of them> are answered 401.
	APIKeysFile string
	// ForwardAuthorization passes the client's Authorization header to the engine
	// unchanged (the default); false removes it (the engine runs without --api-key).
	ForwardAuthorization bool
	// AccessLog writes one INFO line per answered request (endpoint, route, predicted
	// and delivered cached tokens, TTFT, status).
	AccessLog bool
}

// FleetConfig is the endpoints and how their list changes at runtime.
type FleetConfig struct {
	Endpoints []EndpointSpec
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
}

// SelectConfig is the selector for requests KV-Exact does not place: every request with
// KV-Exact off, and KV misses.
type SelectConfig struct {
	Kind             Selector
	CHWBLPrefixBytes int // bytes of the system message / prompt in the chwbl key
}

// KVConfig is KV-Exact routing: the engines' hash contract, how matches are scored and
// chosen among, and the bounds on what it costs.
type KVConfig struct {
	Mode           KVMode
	BlockSize      int
	HashAlgo       string
	HashSeed       string
	HashSeedSet    bool
	Keys           string // auto | engine | rehash
	ScorePrefix    bool   // false: overlap
	MinMatchTokens int
	MaxPromptBytes int // prompt / messages JSON bytes above which KV routing is skipped (0: no bound)
	// MaxKeysPerEndpoint bounds the block keys the inventory holds for one endpoint, so
	// an event stream that misses removes cannot grow memory forever. At the bound a new
	// key evicts an older one of the same endpoint (kvgate_inventory_evicted_total).
	MaxKeysPerEndpoint int
	// LoadFactor is epsilon in the bound ceil((1+epsilon) x mean in-flight). The default 1
	// lets an endpoint take twice the mean before its KV hit goes elsewhere: with a few
	// requests in flight per engine, 0.25 turned most hits away and cost TTFT (bench/RESULTS.md).
	// The chwbl selector keeps the same bound.
	LoadFactor float64
	// Policy chooses among the endpoints once some holds the prompt's prefix: "cost"
	// (predicted time to first token; the default) or "overlap" (the most matched blocks
	// under the load bound).
	Policy string
	// PrefillRate pins every endpoint's prefill rate in tokens/s (0: learned per
	// endpoint from the first tokens kvgate sees, starting from route.PriorRate).
	PrefillRate float64
	// EngineSlots pins how many requests an engine runs at once (0: learned from the
	// engine's reported running count while requests wait).
	EngineSlots int
	// LoadScrape is how often each engine's /metrics is read for its running and
	// waiting requests and KV usage (0: never; kvgate's own accounting only).
	LoadScrape time.Duration
	// TierWeightCPU and TierWeightStorage are what a prompt token cached only in host
	// memory, or only on disk / a remote store, costs the cost policy as a fraction of an
	// uncached token's prefill: the engine loads it over a link instead of computing it.
	// 1 means the tier saves nothing: it is not indexed at all. Defaults:
	// DefaultTierWeightCPU, DefaultTierWeightStorage.
	TierWeightCPU, TierWeightStorage float64
	// PendingTTL: in mode 3, a prompt's blocks count as held by the endpoint kvgate sent
	// it to for this long, until the engine's own events report them (0: off).
	PendingTTL time.Duration
	// FairShare: the cost policy lets no endpoint take more than this times the mean
	// share of recent prefill work, except for requests whose cached prefix there is
	// private (route.Cost); 0 turns the bound off.
	FairShare float64
	// ChainMemoBytes bounds the memo of block-key chain stretches that lets a follow-up
	// turn hash only its new blocks (0: off), one memo per contract the endpoints are
	// keyed under (another block size or engine).
	ChainMemoBytes int64
}

// ModelsConfig is the served models KV-Exact tokenizes for, and how.
type ModelsConfig struct {
	Tokenizers []TokenizerSpec
	LoRA       map[string]string // adapter served name -> base model
	// TokenizeMemoBytes bounds the memo of token IDs between added tokens that lets a
	// follow-up turn tokenize only its new text (0: off).
	TokenizeMemoBytes int64
	// RenderMemoBytes bounds the memo that lets a follow-up turn's chat template render
	// replay the turns rendered before instead of evaluating them again (0: off).
	RenderMemoBytes int64
}

// PDConfig is what only prefill/decode mode 1 uses to pick the prefill endpoint before
// KV-Exact: session affinity and the prefix trie.
type PDConfig struct {
	// PrefixTrieKeys bounds, per prefill endpoint, the block keys mode 1's prefix trie
	// remembers of the prompts kvgate sent there (0: no trie tier).
	PrefixTrieKeys int
	AffinityTTL    time.Duration
	AffinityMax    int // 0: no session affinity
}

// BreakerConfig is each endpoint's circuit breaker.
type BreakerConfig struct {
	Failures  int           // consecutive connect failures that open it
	OpenFor   time.Duration // open period before a half-open trial
	HalfOpen  int           // trial requests allowed while half-open
	Streak5xx int           // consecutive 5xx answers that open it; 0: 5xx do not count
}

// HealthConfig is the active health checks.
type HealthConfig struct {
	Interval time.Duration // 0: no active checks
	Timeout  time.Duration
	Path     string
}

// UpstreamConfig is how kvgate reaches the engines: TLS, timeouts and retries.
type UpstreamConfig struct {
	// CA verifies https:// endpoints (system roots when empty); Cert and Key are an
	// optional client certificate kvgate presents to them.
	CA, Cert, Key  string
	ConnectTimeout time.Duration
	Timeout        time.Duration // until response headers; 504 after
	MaxRetries     int           // 0: up to the number of endpoints
	// Retry5xx: a 5xx answer or a non-streamed body cut short, before any byte reached
	// the client, is dropped and the request sent to another endpoint (the last
	// attempt's answer is relayed as it is).
	Retry5xx bool
}

// LimitsConfig bounds what a client's request may be.
type LimitsConfig struct {
	MaxBodyBytes   int
	MaxHeaderBytes int // request header limit (hertz answers 431 above)
}

// ShutdownConfig is the drain on SIGTERM.
type ShutdownConfig struct {
	// Delay is how long, after SIGTERM, /readyz answers 503 while the public listener
	// keeps serving, so balancers take the replica out before it stops accepting.
	Delay time.Duration
	// Grace is how long in-flight requests may then finish.
	Grace time.Duration
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
	if c.KV.Mode == KVOff || c.planeRoutes() {
		return false, false // a plane route replica's keys come from the stream: GPU keys only
	}
	return c.KV.TierWeightCPU < 1, c.KV.TierWeightStorage < 1
}

// Defaults returns a Config with every documented default filled in; `kvgate serve`'s
// flags take their defaults from it.
func Defaults() Config {
	return Config{
		Listener: ListenerConfig{
			Addr:                 ":8080",
			AdminAddr:            "127.0.0.1:9090",
			ForwardAuthorization: true,
		},
		Fleet: FleetConfig{
			EndpointsWatch: time.Second,
			DNSInterval:    5 * time.Second,
		},
		Select: SelectConfig{Kind: SelectRR, CHWBLPrefixBytes: 256},
		KV: KVConfig{
			Mode:               KVOff,
			BlockSize:          16,
			Keys:               "auto",
			MinMatchTokens:     0,
			MaxPromptBytes:     1 << 20,
			MaxKeysPerEndpoint: shard.DefaultMaxKeysPerEndpoint,
			LoadFactor:         1,
			Policy:             "cost",
			LoadScrape:         50 * time.Millisecond,
			TierWeightCPU:      DefaultTierWeightCPU,
			TierWeightStorage:  DefaultTierWeightStorage,
			PendingTTL:         2 * time.Second,
			FairShare:          route.DefaultFairShare,
			ChainMemoBytes:     hashcore.DefaultChainMemoBytes,
		},
		Models: ModelsConfig{TokenizeMemoBytes: tokenize.DefaultMemoBytes, RenderMemoBytes: tokenize.DefaultRenderMemoBytes},
		PD: PDConfig{
			PrefixTrieKeys: 1 << 18,
			AffinityTTL:    10 * time.Minute,
			AffinityMax:    100000,
		},
		Breaker: BreakerConfig{Failures: 3, OpenFor: 10 * time.Second, HalfOpen: 1},
		Health:  HealthConfig{Interval: 5 * time.Second, Timeout: 2 * time.Second, Path: "/health"},
		Upstream: UpstreamConfig{
			ConnectTimeout: 2 * time.Second,
			Timeout:        300 * time.Second,
			Retry5xx:       true,
		},
		Limits:   LimitsConfig{MaxBodyBytes: 32 << 20, MaxHeaderBytes: 64 << 10},
		Shutdown: ShutdownConfig{Delay: 5 * time.Second, Grace: 30 * time.Second},
		Plane: PlaneConfig{
			Kind:             "direct",
			Stream:           plane.DefaultStream,
			MaxAge:           plane.DefaultMaxAge,
			MaxBytes:         plane.DefaultMaxBytes,
			SnapshotInterval: plane.DefaultSnapshotInterval,
		},
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
	if len(c.Fleet.Endpoints) == 0 {
		return refuse("-endpoint", "at least one endpoint is required (or -endpoints-file)")
	}
	if len(c.Fleet.Endpoints) > shard.MaxEndpoints {
		return refuse("-endpoint", "%d endpoints: at most %d are supported", len(c.Fleet.Endpoints), shard.MaxEndpoints)
	}
	if c.Fleet.MaxEndpoints < 0 || c.Fleet.MaxEndpoints > shard.MaxEndpoints {
		return refuse("-max-endpoints", "%d: want 0 (the initial count rounded up to 8/16/32/64) or 1..%d", c.Fleet.MaxEndpoints, shard.MaxEndpoints)
	}
	if c.Fleet.EndpointsWatch < 0 {
		return refuse("-endpoints-watch", "%v: want >= 0 (0: never reload)", c.Fleet.EndpointsWatch)
	}
	if c.Fleet.DNSInterval < 0 {
		return refuse("-dns-interval", "%v: want >= 0 (0: resolve at start and on reloads only)", c.Fleet.DNSInterval)
	}
	names := map[string]bool{}
	var prefill, decode int
	for i := range c.Fleet.Endpoints {
		e := &c.Fleet.Endpoints[i]
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
	switch c.KV.Mode {
	case KVDisaggregated:
		if prefill == 0 || decode == 0 {
			return refuse("-kv-mode", "mode 1 (prefill/decode) needs at least one endpoint with role=prefill and one with role=decode (have %d prefill, %d decode)", prefill, decode)
		}
		var eng Engine // "": none seen yet
		for i := range c.Fleet.Endpoints {
			e := &c.Fleet.Endpoints[i]
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
	if c.KV.MaxKeysPerEndpoint < 1 {
		return refuse("-kv-max-keys-per-endpoint", "%d: must be >= 1", c.KV.MaxKeysPerEndpoint)
	}
	if c.PD.PrefixTrieKeys < 0 {
		return refuse("-pd-prefix-trie-keys", "%d: must be >= 0 (0: no prefix trie)", c.PD.PrefixTrieKeys)
	}
	if c.KV.Mode != KVOff {
		for _, e := range c.Fleet.Endpoints {
			if e.Engine == EngineLlamaCpp {
				return refuse("-kv-mode", "endpoint %q has engine=llamacpp: llama.cpp publishes no KV-cache events, so KV-Exact has no event contract to follow; use -kv-mode off with -select chwbl for prefix affinity", e.Name)
			}
			if e.Engine != EngineTRTLLM && e.Events == "" && !c.planeRoutes() {
				return refuse("-endpoint", "endpoint %q: KV-Exact needs events=tcp://host:port (the engine's KV event publisher)", e.Name)
			}
			if err := e.checkEventAddrs(); err != nil {
				return refuse("-endpoint", "endpoint %q: %v", e.Name, err)
			}
		}
		if len(c.Models.Tokenizers) == 0 {
			return refuse("-tokenizer", "KV-Exact needs at least one served model mapped to a tokenizer directory (-model NAME -tokenizer DIR)")
		}
		if c.KV.BlockSize < 1 || c.KV.BlockSize > hashcore.MaxBlockSize {
			return refuse("-kv-block-size", "%d: want 1..%d (the engine's block/page size)", c.KV.BlockSize, hashcore.MaxBlockSize)
		}
		if c.KV.MinMatchTokens < 0 {
			return refuse("-kv-min-match-tokens", "must be >= 0")
		}
		if c.KV.MaxPromptBytes < 0 {
			return refuse("-kv-max-prompt-bytes", "must be >= 0 (0: no bound)")
		}
		switch c.KV.Keys {
		case "auto", "engine", "rehash", "fast": // fast: rehash's older name (normalize)
		default:
			return refuse("-kv-keys", "%q: want auto, engine or rehash", c.KV.Keys)
		}
		// vLLM and SGLang endpoints in one rule are each keyed under their own engine's
		// contract and block size (proxy/kv.go endpointContract).
	}
	for _, t := range c.Models.Tokenizers {
		if t.Model == "" || t.Dir == "" {
			return refuse("-tokenizer", "want NAME=DIR or -model NAME -tokenizer DIR")
		}
		if st, err := os.Stat(t.Dir); err != nil || !st.IsDir() {
			return refuse("-tokenizer", "%s: not a directory (want the dir holding tokenizer.json)", t.Dir)
		}
	}
	for a, base := range c.Models.LoRA {
		found := false
		for _, t := range c.Models.Tokenizers {
			found = found || t.Model == base || slices.Contains(t.Aliases, base)
		}
		if !found {
			return refuse("-lora", "%s=%s: base model %q has no -tokenizer", a, base, base)
		}
	}
	switch c.KV.Policy {
	case "cost", "overlap":
	default:
		return refuse("-kv-policy", "%q: want cost or overlap", c.KV.Policy)
	}
	if c.KV.PrefillRate < 0 || math.IsNaN(c.KV.PrefillRate) || math.IsInf(c.KV.PrefillRate, 0) {
		return refuse("-kv-prefill-rate", "%v: want tokens/s > 0, or 0 to learn it", c.KV.PrefillRate)
	}
	if c.KV.EngineSlots < 0 {
		return refuse("-kv-engine-slots", "%d: want >= 0 (0: learn from the engines)", c.KV.EngineSlots)
	}
	for _, w := range [...]struct {
		flag string
		v    float64
	}{{"-kv-tier-weight-cpu", c.KV.TierWeightCPU}, {"-kv-tier-weight-storage", c.KV.TierWeightStorage}} {
		if !(w.v >= 0 && w.v <= 1) {
			return refuse(w.flag, "%v: want a fraction of an uncached token's prefill in [0, 1] (1: the tier is not indexed)", w.v)
		}
	}
	if c.KV.LoadScrape < 0 {
		return refuse("-kv-load-scrape", "%v: want >= 0 (0: off)", c.KV.LoadScrape)
	}
	if c.Models.TokenizeMemoBytes != 0 && c.Models.TokenizeMemoBytes < tokenize.MinMemoBytes {
		return refuse("-tokenize-memo-bytes", "%d: want 0 (off) or >= %d", c.Models.TokenizeMemoBytes, tokenize.MinMemoBytes)
	}
	if c.Models.RenderMemoBytes != 0 && c.Models.RenderMemoBytes < tokenize.MinRenderMemoBytes {
		return refuse("-render-memo-bytes", "%d: want 0 (off) or >= %d", c.Models.RenderMemoBytes, tokenize.MinRenderMemoBytes)
	}
	if c.KV.ChainMemoBytes != 0 && c.KV.ChainMemoBytes < hashcore.MinChainMemoBytes {
		return refuse("-kv-chain-memo-bytes", "%d: want 0 (off) or >= %d", c.KV.ChainMemoBytes, hashcore.MinChainMemoBytes)
	}
	if c.KV.FairShare != 0 && !(c.KV.FairShare >= 1 && c.KV.FairShare <= 100) {
		return refuse("-kv-fair-share", "%v: want 0 (off) or a factor in [1, 100]", c.KV.FairShare)
	}
	if c.KV.PendingTTL < 0 {
		return refuse("-kv-pending-ttl", "%v: want >= 0 (0: off)", c.KV.PendingTTL)
	}
	if c.KV.LoadFactor < 0 || math.IsNaN(c.KV.LoadFactor) || math.IsInf(c.KV.LoadFactor, 0) {
		return refuse("-kv-load-factor", "%v: want epsilon >= 0", c.KV.LoadFactor)
	}
	if c.Breaker.Failures < 1 {
		return refuse("-breaker-failures", "must be >= 1")
	}
	if c.Breaker.OpenFor <= 0 {
		return refuse("-breaker-open", "must be > 0")
	}
	if c.Breaker.HalfOpen < 1 {
		return refuse("-breaker-half-open", "must be >= 1")
	}
	if c.Limits.MaxBodyBytes < 1024 || c.Limits.MaxBodyBytes > 1<<30 {
		return refuse("-max-body-bytes", "%d: want 1024..1073741824 (1 GiB)", c.Limits.MaxBodyBytes)
	}
	if c.Limits.MaxHeaderBytes < 1024 {
		return refuse("-max-header-bytes", "%d: want at least 1024", c.Limits.MaxHeaderBytes)
	}
	if c.Upstream.ConnectTimeout <= 0 {
		return refuse("-connect-timeout", "must be > 0")
	}
	if c.Upstream.Timeout <= 0 {
		return refuse("-upstream-timeout", "must be > 0")
	}
	if c.Health.Interval > 0 && c.Health.Timeout <= 0 {
		return refuse("-health-timeout", "must be > 0")
	}
	if c.Health.Interval > 0 && !strings.HasPrefix(c.Health.Path, "/") {
		// It is joined to each endpoint's http://host:port: without its slash every probe fails.
		return refuse("-health-path", "%q: want a path starting with /", c.Health.Path)
	}
	if c.Select.CHWBLPrefixBytes < 1 {
		return refuse("-chwbl-prefix-bytes", "must be >= 1")
	}
	if c.PD.AffinityMax < 0 {
		return refuse("-affinity-max", "must be >= 0")
	}
	if (c.Listener.TLSCert == "") != (c.Listener.TLSKey == "") {
		return refuse("-tls-cert", "the listener's TLS needs both -tls-cert and -tls-key")
	}
	if c.Shutdown.Delay < 0 {
		return refuse("-shutdown-delay", "must be >= 0")
	}
	if c.Shutdown.Grace < 0 {
		return refuse("-shutdown-grace", "must be >= 0")
	}
	return nil
}

// normalize fills in what Validate accepted in a shorthand: endpoints built by hand
// (a URL and maybe a name, not through ParseEndpoint) get their parsed address, and
// -kv-keys fast becomes rehash. It works on its own copy of the endpoint list. Validate
// must have passed.
func (c *Config) normalize() {
	c.Fleet.Endpoints = slices.Clone(c.Fleet.Endpoints)
	for i := range c.Fleet.Endpoints {
		e := &c.Fleet.Endpoints[i]
		if e.host == "" {
			p, _ := ParseEndpoint("url=" + e.URL + ",name=" + e.Name)
			e.URL, e.host, e.scheme = p.URL, p.host, p.scheme
			if e.Name == "" {
				e.Name = p.Name
			}
		}
	}
	if c.KV.Keys == "fast" {
		c.KV.Keys = "rehash"
	}
}
