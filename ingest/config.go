// Package ingest keeps each endpoint's inventory in step with what its engine caches,
// from the engine's own KV events: vLLM and SGLang over ZeroMQ (seq window, replay),
// TensorRT-LLM through its destructive HTTP drain. It proves live that kvgate's block
// keys equal the engine's (parity attestation) and falls back to its own re-hashed keys
// when they do not.
package ingest

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/kvgate/kvgate/engine"
	"github.com/kvgate/kvgate/hashcore"
)

// KeyMode says which keys an endpoint's inventory holds.
type KeyMode uint8

const (
	// KeysAuto indexes the engine's keys while parity holds and switches an endpoint to
	// kvgate's re-hashed keys when its parity fails.
	KeysAuto KeyMode = iota
	// KeysEngine always indexes the engine's keys.
	KeysEngine
	// KeysRehash always indexes kvgate's fast keys computed from the events' token_ids.
	KeysRehash
)

func (m KeyMode) String() string {
	switch m {
	case KeysEngine:
		return "engine"
	case KeysRehash:
		return "rehash"
	}
	return "auto"
}

// ParseKeyMode parses the -kv-keys flag value: engine, rehash or auto ("" = auto).
func ParseKeyMode(s string) (KeyMode, error) {
	switch s {
	case "", "auto":
		return KeysAuto, nil
	case "engine":
		return KeysEngine, nil
	case "rehash":
		return KeysRehash, nil
	}
	return KeysAuto, fmt.Errorf("ingest: -kv-keys %q: want engine, rehash or auto", s)
}

// Inventory is the part of shard.Inventory ingest writes to.
type Inventory interface {
	Add(ep int, keys []uint64) int
	Remove(ep int, keys []uint64) int
	ClearEndpoint(ep int)
	Count(ep int) int
}

// heldInventory is an Inventory that also says which stores were repeats and lists an
// endpoint's keys, as *shard.Inventory does: with it a rank keeps the hashes it holds
// once on its GPU tier without holder-count entries (rankState.singles).
type heldInventory interface {
	Inventory
	AddHeld(ep int, keys, held []uint64) (int, []uint64)
	Keys(ep int, cursor uint64, limit int, dst []uint64) ([]uint64, uint64)
}

// EndpointConfig is one engine endpoint to follow.
type EndpointConfig struct {
	Name   string
	Index  int         // slot in the inventory
	Engine engine.Kind // one with an event contract: vllm, sglang or trtllm
	Events string      // ZeroMQ PUB endpoint, e.g. tcp://127.0.0.1:5557 (rank r uses port+r)
	Replay string      // optional ROUTER replay endpoint (rank r uses port+r)
	DP     int         // data-parallel ranks, default 1
	// RankSlots are the inventory slots of ranks 1..DP-1 (rank 0 is Index): each rank
	// is its own engine with its own cache, so each keeps its own keys. Needed when DP > 1.
	RankSlots []int
	// CPUSlots and StorageSlots, when set (one per rank, rank order), index the blocks a
	// rank holds off the GPU apart from its routed keys: CPU (vLLM "CPU", SGLang
	// CPU_PINNED) and storage (STORAGE, DISK, EXTERNAL, a connector's own), so routing can
	// weigh a hit there by what loading it costs. A tier with no slot is not indexed
	// (unless Config.Routed merges it into the rank's own slot).
	CPUSlots, StorageSlots []int
	// Spec is the endpoint's own contract (engine, algo, block size, seed); nil: the
	// rule's (Config.Chain, Config.Spec). FixedBlockSize pins its block size; otherwise
	// the block size the engine's events prove is adopted (a WARN, Status.BlockSize).
	Spec           *hashcore.Spec
	FixedBlockSize bool
	Topic          string // "" accepts every topic
	URL            string // trtllm: base URL whose POST /kv_cache_events is drained
}

// Media is a set of cache tiers, one bit per Medium.
type Media uint8

// MediaGPU is the default routed set: only blocks in GPU memory count for routing.
const MediaGPU Media = 1 << MediumGPU

// Has reports whether m holds tier t.
func (m Media) Has(t Medium) bool { return m&(1<<t) != 0 }

// Config is shared by every endpoint of a rule.
type Config struct {
	Inventory Inventory // normally a *shard.Inventory
	// OnKeysChange, when set, is called after each move of Manager.KeyGen (an event
	// plane's fallback manager tells its route replica).
	OnKeysChange func()
	// Slots is how many inventory indices endpoints may take, those added at runtime
	// (Manager.AddEndpoint) included; 0: the largest given index + 1.
	Slots int
	// Chain is the rule's contract: used to attest parity and, in engine/auto mode, the
	// keys the request path computes. nil disables attestation (parity stays unknown).
	Chain hashcore.Chain
	// Spec is the contract Chain was built from; with it a mismatch is diagnosed (seed,
	// algo, block size) by trying the alternatives once. Optional.
	Spec *hashcore.Spec
	// Fast is kvgate's own key chain for re-hashed keys (and TensorRT-LLM). nil =
	// hashcore.NewFast(Chain's block size).
	Fast hashcore.Chain
	Keys KeyMode
	// Routed is the set of cache tiers whose blocks are indexed for routing (default GPU).
	// The inventory is a set, so a tier either counts fully or not at all; every tier's
	// block count is tracked either way.
	Routed Media
	// BlockMapSize bounds the per-endpoint engine-hash -> digest map (default 1<<17).
	BlockMapSize int
	// RefCountSize bounds the per-endpoint engine-hash -> holders-per-tier table that
	// keeps a removal from deleting a key another holder still has, in 16-byte entries
	// (default BlockMapSize; one in eight is a set header, so 7/8 of it are holders).
	RefCountSize int
	// SeqWindow is the largest gap that keeps the inventory (default 64).
	SeqWindow int

	RetryInterval    time.Duration // first redial delay (default 1s)
	MaxRetryInterval time.Duration // backoff cap (default 30s)
	DialTimeout      time.Duration // TCP connect + ZMTP handshake (default 3s)
	ReplayTimeout    time.Duration // whole bootstrap replay (default 5s)
	// TensorRT-LLM drain polling: BusyPoll after a non-empty drain, growing to IdlePoll.
	BusyPoll, IdlePoll time.Duration // defaults 5ms, 50ms
	HTTPTimeout        time.Duration // one drain request (default 2s)
	// TLS verifies https:// TensorRT-LLM endpoints' drains (CA bundle, client
	// certificate): the proxy passes the one its HTTP forwarder uses. nil: system roots.
	TLS *tls.Config

	Logger  *slog.Logger
	Metrics *metrics.Set // nil = no exported metrics (counters still feed Status)
}

func (c *Config) defaults() error {
	if c.Inventory == nil {
		return errors.New("ingest: no inventory")
	}
	if c.Fast == nil {
		bs := 16
		if c.Chain != nil {
			bs = c.Chain.BlockSize()
		}
		c.Fast = hashcore.NewFast(bs)
	}
	if c.Routed == 0 {
		c.Routed = MediaGPU
	}
	if c.BlockMapSize <= 0 {
		c.BlockMapSize = 1 << 17
	}
	if c.RefCountSize <= 0 {
		c.RefCountSize = c.BlockMapSize
	}
	if c.SeqWindow <= 0 {
		c.SeqWindow = 64
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.RetryInterval, time.Second)
	def(&c.MaxRetryInterval, 30*time.Second)
	if c.MaxRetryInterval < c.RetryInterval {
		c.MaxRetryInterval = c.RetryInterval
	}
	def(&c.DialTimeout, 3*time.Second)
	def(&c.ReplayTimeout, 5*time.Second)
	def(&c.BusyPoll, 5*time.Millisecond)
	def(&c.IdlePoll, 50*time.Millisecond)
	def(&c.HTTPTimeout, 2*time.Second)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// The EndpointConfig fields a FieldError blames, spelled as proxy's -endpoint keys.
const (
	FieldName   = "name"
	FieldIndex  = "index"
	FieldEngine = "engine"
	FieldEvents = "events"
	FieldReplay = "replay"
	FieldURL    = "url"
)

// FieldError is an endpoint NewManager refuses. Field names the EndpointConfig field to
// fix (one of the Field constants), so a caller names its own flag or key without
// reading Msg.
type FieldError struct {
	Endpoint string // the endpoint's name ("" when it has none)
	Field    string
	Msg      string // the whole message, "ingest: ..."
}

func (e *FieldError) Error() string { return e.Msg }

func fieldError(endpoint, field, format string, a ...any) error {
	return &FieldError{Endpoint: endpoint, Field: field, Msg: fmt.Sprintf(format, a...)}
}

func (e *EndpointConfig) validate() error {
	if e.Name == "" {
		return fieldError("", FieldName, "ingest: endpoint without a name")
	}
	if e.Index < 0 {
		return fieldError(e.Name, FieldIndex, "ingest: %s: negative index", e.Name)
	}
	if e.DP <= 0 {
		e.DP = 1
	}
	if e.Engine == engine.TRTLLM && e.DP > 1 {
		return fmt.Errorf("ingest: %s: dp=%d: TensorRT-LLM publishes one drain per server (attention DP ranks are not followed apart)", e.Name, e.DP)
	}
	if e.DP > 1 && len(e.RankSlots) != e.DP-1 {
		return fmt.Errorf("ingest: %s: dp=%d needs an inventory slot for each of ranks 1..%d, got %d", e.Name, e.DP, e.DP-1, len(e.RankSlots))
	}
	for _, s := range e.RankSlots {
		if s < 0 {
			return fmt.Errorf("ingest: %s: negative rank slot", e.Name)
		}
	}
	for _, t := range [...][]int{e.CPUSlots, e.StorageSlots} {
		if len(t) != 0 && len(t) != e.DP {
			return fmt.Errorf("ingest: %s: %d tier slots for %d ranks", e.Name, len(t), e.DP)
		}
		for _, s := range t {
			if s < 0 {
				return fmt.Errorf("ingest: %s: negative tier slot", e.Name)
			}
		}
	}
	switch e.Engine {
	case engine.VLLM, engine.SGLang:
		if _, _, err := splitTCP(e.Events); err != nil {
			return fieldError(e.Name, FieldEvents, "ingest: %s: events endpoint: %v", e.Name, err)
		}
		if e.Replay != "" {
			if _, _, err := splitTCP(e.Replay); err != nil {
				return fieldError(e.Name, FieldReplay, "ingest: %s: replay endpoint: %v", e.Name, err)
			}
		}
	case engine.TRTLLM:
		u, err := url.Parse(e.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fieldError(e.Name, FieldURL, "ingest: %s: trtllm needs an http(s) base URL, got %q", e.Name, e.URL)
		}
	case engine.LlamaCpp, "llama.cpp": // a KV-Exact rule naming llama.cpp is refused by the proxy before it gets here
		return fieldError(e.Name, FieldEngine, "ingest: %s: llama.cpp publishes no KV events; KV-Exact cannot follow it (use -select chwbl)", e.Name)
	default:
		return fieldError(e.Name, FieldEngine, "ingest: %s: engine %q has no event contract (want vllm, sglang or trtllm)", e.Name, e.Engine)
	}
	return nil
}
