package enginesim

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/hashcore"
)

// Spec is a simulator described the way its command line describes it; Launch turns it
// into a running Sim. The bench harness and `kvgate engine-sim` both start sims from one.
type Spec struct {
	Name, Engine, Model, Role string
	LoRAs                     []string
	Encoder                   Encoder // nil: prompts must be token-id lists
	// TokenizeDrift makes the engine tokenize unlike Encoder (one extra leading token on
	// every prompt, in /tokenize and in generation alike): a deliberately mismatched
	// engine for parity checks and `kvgate doctor`.
	TokenizeDrift bool

	BlockSize int
	HashAlgo  string // vLLM --prefix-caching-hash-algo; ignored for SGLang
	HashSeed  string // PYTHONHASHSEED
	SeedSet   bool

	NumBlocks, MaxBatch, DefaultMaxTokens        int
	PrefillBase, PrefillPerToken, DecodePerToken time.Duration
	PrefillShared                                bool // Config.PrefillShared

	Listen string // HTTP address, e.g. 127.0.0.1:0

	// SGLang prefill role: the bootstrap server's port on the Listen host (SGLang's
	// --disaggregation-bootstrap-port; 0 = any free port, see Sim.BootstrapAddr) and how
	// long a decode waits for its prefill's KV (Config.BootstrapTimeout).
	BootstrapPort    int
	BootstrapTimeout time.Duration

	// Events (vLLM, SGLang): PUB endpoint ("" = no events), optional replay ROUTER.
	Events, Replay, Topic string
	Layout                string // array (default) | map
	ReplayBuffer          int
	// DPRank is this engine core's data-parallel rank (LaunchDP sets it): its events'
	// data_parallel_rank and its metrics' engine label.
	DPRank int
}

// Launch builds the chain and event sink for sp, then starts serving HTTP.
func Launch(sp Spec) (*Sim, error) {
	engine := sp.Engine
	if engine == "" {
		engine = EngineVLLM
	}
	bs := sp.BlockSize
	if bs <= 0 {
		bs = 16
		if engine == EngineSGLang {
			bs = 1
		}
		if engine == EngineTRTLLM {
			bs = 32
		}
	}
	hs := hashcore.Spec{Engine: "vllm", Algo: sp.HashAlgo, BlockSize: bs, Seed: sp.HashSeed, SeedSet: sp.SeedSet}
	if engine == EngineSGLang {
		hs = hashcore.Spec{Engine: "sglang", BlockSize: bs}
	}
	chain, err := hashcore.New(hs)
	if err != nil {
		return nil, err
	}
	enc := sp.Encoder
	if sp.TokenizeDrift {
		if enc == nil {
			return nil, fmt.Errorf("enginesim: tokenize drift needs a tokenizer")
		}
		enc = driftEncoder{enc}
	}
	cfg := Config{Name: sp.Name, Engine: engine, Model: sp.Model, LoRAs: sp.LoRAs, Encoder: enc, Chain: chain,
		Role: sp.Role, NumBlocks: sp.NumBlocks, MaxBatch: sp.MaxBatch, DefaultMaxTokens: sp.DefaultMaxTokens,
		PrefillBase: sp.PrefillBase, PrefillPerToken: sp.PrefillPerToken, DecodePerToken: sp.DecodePerToken,
		PrefillShared: sp.PrefillShared, BootstrapTimeout: sp.BootstrapTimeout, EngineIndex: sp.DPRank}
	listen := sp.Listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	if engine == EngineSGLang && sp.Role == RolePrefill {
		host, _, err := net.SplitHostPort(listen)
		if err != nil {
			return nil, fmt.Errorf("enginesim: listen address %q: %w", listen, err)
		}
		cfg.BootstrapListen = net.JoinHostPort(host, strconv.Itoa(sp.BootstrapPort))
	}
	var closeSink func()
	switch {
	case engine == EngineTRTLLM:
		cfg.TRT = &TRTSink{Q: &enginepub.TRTQueue{}}
	case sp.Events != "":
		f := enginepub.Format{Flavor: enginepub.VLLM, DPRank: sp.DPRank}
		switch sp.Layout {
		case "", "array":
		case "map":
			f.Layout = enginepub.LayoutMap
		default:
			return nil, fmt.Errorf("enginesim: event layout %q: want array or map", sp.Layout)
		}
		if engine == EngineSGLang {
			f = enginepub.Format{Flavor: enginepub.SGLang, DPRank: sp.DPRank}
		}
		z, err := NewZMQSink(enginepub.Config{Endpoint: sp.Events, Replay: sp.Replay, Topic: sp.Topic, Format: f,
			ReplayBuffer: sp.ReplayBuffer, ReplayTopicFrame: engine == EngineVLLM})
		if err != nil {
			return nil, fmt.Errorf("enginesim: events on %s: %w", sp.Events, err)
		}
		closeSink = func() { z.Close() }
		cfg.Sink = z
		if engine == EngineSGLang {
			cfg.Sink = SGLangSink{z}
		}
	}
	s, err := New(cfg)
	if err != nil {
		if closeSink != nil {
			closeSink()
		}
		return nil, err
	}
	if err := s.Listen(listen); err != nil {
		if closeSink != nil {
			closeSink()
		}
		return nil, err
	}
	return s, nil
}

// EventsAddr is the bound PUB address ("" without ZeroMQ events).
func (s *Sim) EventsAddr() string {
	if z := s.zmq(); z != nil {
		return z.Pub.Addr()
	}
	return ""
}

// ReplayAddr is the bound replay ROUTER address, or "".
func (s *Sim) ReplayAddr() string {
	if z := s.zmq(); z != nil {
		return z.Pub.ReplayAddr()
	}
	return ""
}

func (s *Sim) zmq() *ZMQSink {
	switch z := s.cfg.Sink.(type) {
	case *ZMQSink:
		return z
	case SGLangSink:
		return z.ZMQSink
	}
	return nil
}

// WaitSubscribed waits until a subscriber joined the event PUB socket (ZeroMQ drops
// messages published before that). Engines without ZeroMQ events return at once.
func (s *Sim) WaitSubscribed(ctx context.Context, timeout time.Duration) error {
	z := s.zmq()
	if z == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return z.Pub.WaitSubscribed(ctx)
}
