package enginesim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/engine"
	"github.com/kvgate/kvgate/hashcore"
)

// Engine flavours the simulator can play: package engine's names, as the strings its
// flags and Spec carry.
const (
	EngineVLLM   = string(engine.VLLM)
	EngineSGLang = string(engine.SGLang)
	EngineTRTLLM = string(engine.TRTLLM)
)

// P/D roles.
const (
	RoleBoth    = "both"
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// Config is one simulated engine.
type Config struct {
	Name   string // engine id in logs, headers and kv_transfer_params
	Engine string // vllm (default), sglang, trtllm
	Model  string // served model name
	// LoRAs are adapter names served as extra model names; their requests hash with the
	// adapter name in every block's extra keys.
	LoRAs   []string
	Encoder Encoder
	Chain   hashcore.Chain
	Role    string // both (default), prefill, decode

	NumBlocks int // KV pool size in blocks
	MaxBatch  int // requests running at once; the rest wait in a queue

	// Latency model: prefill = PrefillBase + PrefillPerToken x uncached prompt tokens;
	// each further output token takes DecodePerToken.
	PrefillBase, PrefillPerToken, DecodePerToken time.Duration
	DefaultMaxTokens                             int
	// PrefillShared makes the PrefillPerToken part one compute shared equally by the
	// requests prefilling at once (a GPU's prefill throughput does not grow with its
	// batch); PrefillBase stays a per-request fixed cost, paid first. Off: every request
	// prefills in parallel at full rate.
	PrefillShared bool

	// BootstrapListen (SGLang, role prefill) is where the simulated bootstrap server
	// listens, the port decode engines pull KV through (SGLang's
	// --disaggregation-bootstrap-port); "" = none.
	BootstrapListen string
	// BootstrapTimeout bounds a decode's wait for its prefill's KV (default 30s).
	BootstrapTimeout time.Duration

	// EngineIndex is the engine core's index in a data-parallel engine (its rank): the
	// engine label on its vLLM metrics. 0 without data parallelism.
	EngineIndex int

	// Sink receives cache events (nil = none). NewEventSink builds one for vLLM/SGLang.
	Sink Sink
	// TRT, when set (trtllm engine), queues events for POST /kv_cache_events.
	TRT *TRTSink
}

// Sim is a running engine simulator.
type Sim struct {
	cfg    Config
	pool   *Pool
	sched  *scheduler
	shared *sharedPrefill   // nil unless cfg.PrefillShared
	boot   *bootstrapServer // SGLang prefill role: the bootstrap port
	ln     net.Listener
	srv    *http.Server
	loras  map[string]bool
	nextID atomic.Uint64

	// counters
	reqOK, reqErr, promptTok, cachedTok, genTok atomic.Uint64
	prefilling                                  atomic.Int64  // requests in their prefill now
	transferring                                atomic.Int64  // SGLang decode: requests waiting for their KV
	trtIter, trtCompleted                       atomic.Uint64 // TensorRT-LLM iteration stats state
}

// New validates cfg and builds the simulator (not yet listening).
func New(cfg Config) (*Sim, error) {
	if cfg.Engine == "" {
		cfg.Engine = EngineVLLM
	}
	switch cfg.Engine {
	case EngineVLLM, EngineSGLang, EngineTRTLLM:
	default:
		return nil, fmt.Errorf("enginesim: unknown engine %q (want vllm, sglang or trtllm)", cfg.Engine)
	}
	if cfg.Role == "" {
		cfg.Role = RoleBoth
	}
	switch cfg.Role {
	case RoleBoth, RolePrefill, RoleDecode:
	default:
		return nil, fmt.Errorf("enginesim: unknown role %q (want both, prefill or decode)", cfg.Role)
	}
	if cfg.Chain == nil {
		return nil, errors.New("enginesim: no hash chain configured")
	}
	if cfg.Model == "" {
		cfg.Model = "sim"
	}
	if cfg.Name == "" {
		cfg.Name = "sim"
	}
	if cfg.NumBlocks <= 0 {
		cfg.NumBlocks = 4096
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 16
	}
	if cfg.DefaultMaxTokens <= 0 {
		cfg.DefaultMaxTokens = 16
	}
	if cfg.BootstrapTimeout <= 0 {
		cfg.BootstrapTimeout = 30 * time.Second
	}
	if cfg.BootstrapListen != "" && (cfg.Engine != EngineSGLang || cfg.Role != RolePrefill) {
		return nil, errors.New("enginesim: a bootstrap server is for an SGLang engine in the prefill role")
	}
	s := &Sim{cfg: cfg, loras: map[string]bool{}}
	for _, l := range cfg.LoRAs {
		s.loras[l] = true
	}
	var sink Sink = cfg.Sink
	if cfg.TRT != nil {
		sink = cfg.TRT
	}
	s.pool = NewPool(cfg.NumBlocks, cfg.Chain.BlockSize(), sink)
	s.sched = &scheduler{pool: s.pool, maxBatch: cfg.MaxBatch}
	if cfg.PrefillShared {
		s.shared = newSharedPrefill()
	}
	if cfg.TRT != nil {
		cfg.TRT.Q.Created(cfg.NumBlocks)
	}
	return s, nil
}

// Pool exposes the simulator's block pool (tests and the oracle policy read it).
func (s *Sim) Pool() *Pool { return s.pool }

// Config returns the effective configuration.
func (s *Sim) Config() Config { return s.cfg }

// Listen starts serving HTTP on addr (e.g. 127.0.0.1:0).
func (s *Sim) Listen(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	if s.cfg.BootstrapListen != "" {
		if s.boot, err = startBootstrap(s.cfg.BootstrapListen, s.cfg.BootstrapTimeout); err != nil {
			ln.Close()
			return fmt.Errorf("enginesim: bootstrap server on %s: %w", s.cfg.BootstrapListen, err)
		}
	}
	s.ln = ln
	s.srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go s.srv.Serve(ln)
	return nil
}

// BootstrapAddr is the SGLang bootstrap server's address, or "".
func (s *Sim) BootstrapAddr() string {
	if s.boot == nil {
		return ""
	}
	return s.boot.ln.Addr().String()
}

// Addr is the listening address (host:port).
func (s *Sim) Addr() string { return s.ln.Addr().String() }

// URL is the base URL, http://host:port.
func (s *Sim) URL() string { return "http://" + s.Addr() }

// Close stops the HTTP server and the event sink.
func (s *Sim) Close() error {
	var err error
	if s.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err = s.srv.Shutdown(ctx)
		cancel()
		if err != nil {
			s.srv.Close()
		}
	}
	if s.boot != nil {
		s.boot.close()
	}
	if c, ok := s.cfg.Sink.(interface{ Close() error }); ok {
		if e := c.Close(); e != nil && err == nil {
			err = e
		}
	}
	return err
}

// Handler is the simulator's HTTP API.
func (s *Sim) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.serveGenerate(w, r, false) })
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.serveGenerate(w, r, true) })
	mux.HandleFunc("GET /v1/models", s.serveModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /metrics", s.serveMetrics)
	mux.HandleFunc("POST /reset_prefix_cache", func(w http.ResponseWriter, r *http.Request) { s.pool.Reset(); w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("POST /debug/probe", s.serveProbe)
	mux.HandleFunc("GET /debug/stats", s.serveStats)
	if s.cfg.Engine == EngineTRTLLM {
		mux.HandleFunc("POST /kv_cache_events", s.serveTRTEvents)
		mux.HandleFunc("GET /prometheus/metrics", s.serveTRTPrometheus)
		mux.HandleFunc("GET /server_info", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"tokens_per_block":%d,"model":%q}`, s.pool.BlockSize(), s.cfg.Model)
		})
	}
	if s.cfg.Engine != EngineTRTLLM {
		mux.HandleFunc("POST /tokenize", s.serveTokenize)
	}
	if s.cfg.Engine == EngineSGLang {
		mux.HandleFunc("POST /v1/tokenize", s.serveTokenize)
		mux.HandleFunc("GET /get_model_info", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"model_path":%q,"is_generation":true}`, s.cfg.Model)
		})
	}
	return mux
}

// genRequest is the part of an OpenAI request body the simulator reads.
type genRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	ChatTemplateKwargs  json.RawMessage `json:"chat_template_kwargs"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	CacheSalt string `json:"cache_salt"`
	// PromptTokenIDs: TensorRT-LLM's disaggregated server puts the context server's
	// prompt ids on a chat generation request, and the generation server uses them.
	PromptTokenIDs []uint32 `json:"prompt_token_ids"`
	chatSwitches
	pdFields
}

// chatSwitches are vLLM's request fields that change how a prompt is templated and
// tokenized (chat completions, completions and /tokenize share them).
type chatSwitches struct {
	AddGenerationPrompt  *bool `json:"add_generation_prompt"`
	ContinueFinalMessage bool  `json:"continue_final_message"`
	AddSpecialTokens     *bool `json:"add_special_tokens"`
}

// chatPrompt applies vLLM's defaults: the generation prompt unless the final message is
// continued (an unset add_generation_prompt yields to continue_final_message, as kvgate's
// router reads it), no extra special tokens.
func (c *chatSwitches) chatPrompt(messages, tools, kwargs json.RawMessage) (*ChatPrompt, error) {
	if len(messages) == 0 || string(messages) == "null" {
		return nil, badRequest("messages is required")
	}
	gen := c.AddGenerationPrompt == nil || *c.AddGenerationPrompt
	if c.ContinueFinalMessage {
		if c.AddGenerationPrompt != nil && *c.AddGenerationPrompt {
			return nil, badRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
		}
		gen = false
	}
	return &ChatPrompt{Messages: messages, Tools: nullToNil(tools), TemplateKwargs: nullToNil(kwargs),
		AddGenerationPrompt: gen, ContinueFinalMessage: c.ContinueFinalMessage,
		AddSpecialTokens: c.AddSpecialTokens != nil && *c.AddSpecialTokens}, nil
}

// promptSpecial is add_special_tokens for a text prompt (vLLM: true unless set).
func (c *chatSwitches) promptSpecial() bool { return c.AddSpecialTokens == nil || *c.AddSpecialTokens }

type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(format string, a ...any) error {
	return &httpError{code: http.StatusBadRequest, msg: fmt.Sprintf(format, a...)}
}

// prepared is a parsed request with its tokens and keys.
type prepared struct {
	req    genRequest
	chat   bool
	tokens []uint32
	keys   []uint64
	lora   string
	maxNew int    // output tokens this engine generates
	asked  int    // output tokens the client asked for (a prefill leg generates 1 of them)
	seed   uint64 // FNV-1a of the tokens: names the prompt (output words, P/D checks)
	pd     pdPlan
}

func (s *Sim) prepare(body io.Reader, chat bool) (*prepared, error) {
	var p prepared
	p.chat = chat
	dec := json.NewDecoder(io.LimitReader(body, 64<<20))
	if err := dec.Decode(&p.req); err != nil {
		return nil, badRequest("invalid JSON body: %v", err)
	}
	var err error
	if p.lora, err = s.lookupModel(p.req.Model); err != nil {
		return nil, err
	}
	trtIDs := chat && s.cfg.Engine == EngineTRTLLM && len(p.req.PromptTokenIDs) > 0
	if s.cfg.Encoder == nil && (chat && !trtIDs || isStringPrompt(p.req.Prompt)) {
		return nil, badRequest("this engine has no tokenizer: send prompt as a list of token ids")
	}
	switch {
	case trtIDs:
		p.tokens = p.req.PromptTokenIDs
	case chat:
		var c *ChatPrompt
		if c, err = p.req.chatPrompt(p.req.Messages, p.req.Tools, p.req.ChatTemplateKwargs); err != nil {
			return nil, err
		}
		p.tokens, err = s.cfg.Encoder.EncodeChat(nil, c)
	default:
		p.tokens, err = s.encodeCompletionPrompt(p.req.Prompt, p.req.promptSpecial())
	}
	if err != nil {
		var he *httpError
		if errors.As(err, &he) {
			return nil, err
		}
		return nil, badRequest("tokenize: %v", err)
	}
	if len(p.tokens) == 0 {
		return nil, badRequest("prompt is empty")
	}
	p.maxNew = s.cfg.DefaultMaxTokens
	if p.req.MaxTokens != nil {
		p.maxNew = *p.req.MaxTokens
	}
	if p.req.MaxCompletionTokens != nil {
		p.maxNew = *p.req.MaxCompletionTokens
	}
	if p.maxNew < 1 {
		return nil, badRequest("max_tokens must be at least 1, got %d", p.maxNew)
	}
	p.seed = 1469598103934665603
	for _, t := range p.tokens {
		p.seed = (p.seed ^ uint64(t)) * 1099511628211
	}
	if err := s.parsePD(&p); err != nil {
		return nil, err
	}
	p.asked = p.maxNew
	if p.pd.step == pdPrefill {
		p.maxNew = 1 // the prefill side of a P/D pair stops after the first token
	}
	var ex *hashcore.Extras
	if p.lora != "" || p.req.CacheSalt != "" {
		ex = &hashcore.Extras{LoRAName: p.lora, CacheSalt: p.req.CacheSalt}
	}
	p.keys = hashcore.Keys(s.cfg.Chain, nil, p.tokens, ex)
	return &p, nil
}

// lookupModel resolves a request's model name: the served model (or none given), or one of
// its LoRA adapters (returned).
func (s *Sim) lookupModel(name string) (lora string, err error) {
	switch {
	case name == "" || name == s.cfg.Model:
		return "", nil
	case s.loras[name]:
		return name, nil
	}
	return "", &httpError{code: http.StatusNotFound, msg: fmt.Sprintf("The model `%s` does not exist.", name)}
}

func isStringPrompt(raw json.RawMessage) bool {
	t := strings.TrimLeft(string(raw), " \t\r\n[")
	return strings.HasPrefix(t, `"`)
}

func nullToNil(b json.RawMessage) []byte {
	if len(b) == 0 || string(b) == "null" {
		return nil
	}
	return b
}

// encodeCompletionPrompt accepts what vLLM accepts for one prompt: a string, a list of
// token IDs, or a one-element list of either.
func (s *Sim) encodeCompletionPrompt(raw json.RawMessage, addSpecialTokens bool) ([]uint32, error) {
	raw = json.RawMessage(strings.TrimSpace(string(raw)))
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("prompt is required")
	}
	switch raw[0] {
	case '"':
		var str string
		if err := json.Unmarshal(raw, &str); err != nil {
			return nil, badRequest("invalid prompt: %v", err)
		}
		if !addSpecialTokens {
			return s.cfg.Encoder.EncodeText(nil, str)
		}
		return s.cfg.Encoder.EncodePrompt(nil, str)
	case '[':
		var ids []int64
		if err := json.Unmarshal(raw, &ids); err == nil {
			out := make([]uint32, len(ids))
			for i, v := range ids {
				if v < 0 || v > 1<<32-1 {
					return nil, badRequest("prompt token id %d out of range", v)
				}
				out[i] = uint32(v)
			}
			return out, nil
		}
		var list []json.RawMessage
		if err := json.Unmarshal(raw, &list); err != nil || len(list) != 1 {
			return nil, badRequest("prompt must be a string, a list of token ids, or a one-element list of either")
		}
		return s.encodeCompletionPrompt(list[0], addSpecialTokens)
	}
	return nil, badRequest("prompt must be a string or a list of token ids")
}

func writeError(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	var he *httpError
	if errors.As(err, &he) {
		code = he.code
	} else if errors.Is(err, ErrTooLarge) {
		code = http.StatusBadRequest
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	b, _ := json.Marshal(map[string]any{"object": "error", "message": err.Error(), "type": http.StatusText(code), "code": code})
	w.Write(b)
}

func (s *Sim) serveGenerate(w http.ResponseWriter, r *http.Request, chat bool) {
	p, err := s.prepare(r.Body, chat)
	if err != nil {
		s.reqErr.Add(1)
		writeError(w, err)
		return
	}
	ctx := r.Context()
	sglangRoom := s.boot != nil && p.pd.step == pdPrefill
	if sglangRoom {
		if err := s.boot.open(p.pd.room); err != nil {
			s.reqErr.Add(1)
			writeError(w, err)
			return
		}
		// The room fails unless its prefill completes (finish is once per room).
		defer s.boot.finish(p.pd.room, false, 0, 0)
	}
	alloc, err := s.sched.admit(ctx, p.keys, p.tokens, p.maxNew, p.lora)
	if err != nil {
		s.reqErr.Add(1)
		if ctx.Err() == nil {
			writeError(w, err)
		}
		return
	}
	defer s.sched.finish(alloc)
	if p.pd.step == pdDecode && p.pd.bootstrap != "" {
		// SGLang: the decode server pulls the KV from the prefill server's bootstrap port.
		s.transferring.Add(1)
		err := s.fetchKV(ctx, p)
		s.transferring.Add(-1)
		if err != nil {
			s.reqErr.Add(1)
			if ctx.Err() == nil {
				writeError(w, err)
			}
			return
		}
	}
	cached := alloc.CachedTokens
	compute := time.Duration(len(p.tokens)-cached) * s.cfg.PrefillPerToken
	if p.pd.step == pdDecode {
		// The KV arrives from the prefill engine: only the fixed cost remains.
		compute = 0
	}
	s.promptTok.Add(uint64(len(p.tokens)))
	s.cachedTok.Add(uint64(cached))
	id := s.nextID.Add(1)
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	g := &gen{s: s, p: p, w: w, id: prefix + s.cfg.Name + "-" + strconv.FormatUint(id, 10), reqID: id,
		created: time.Now().Unix(), cached: cached, seed: p.seed, alloc: alloc}
	w.Header().Set("X-Engine-Id", s.cfg.Name)
	s.prefilling.Add(1)
	ok := s.prefill(ctx, compute)
	s.prefilling.Add(-1)
	if !ok {
		s.reqErr.Add(1)
		return
	}
	if sglangRoom {
		s.boot.finish(p.pd.room, true, len(p.tokens), p.seed)
	}
	if p.req.Stream {
		g.stream(ctx)
	} else {
		g.whole(ctx)
	}
}

// prefill waits out a request's prefill: the fixed cost, then compute (full-rate prefill
// time of its uncached tokens), alone or shared with the other prefills.
func (s *Sim) prefill(ctx context.Context, compute time.Duration) bool {
	if s.shared == nil {
		return sleepCtx(ctx, s.cfg.PrefillBase+compute)
	}
	return sleepCtx(ctx, s.cfg.PrefillBase) && s.shared.run(ctx, compute)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// words are the simulated output vocabulary.
var words = [...]string{"the", "cache", "block", "engine", "token", "prefix", "router", "model", "request",
	"latency", "memory", "batch", "decode", "prefill", "event", "queue", "shard", "key", "hash", "load"}

type gen struct {
	s       *Sim
	p       *prepared
	w       http.ResponseWriter
	id      string
	reqID   uint64
	created int64
	cached  int
	seed    uint64
	alloc   *Alloc
}

// wordIndex is output token i: an index into words (also its token id where one is shown).
func (g *gen) wordIndex(i int) uint64 {
	x := g.seed + uint64(i)*0x9e3779b97f4a7c15
	x ^= x >> 31
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 29
	return x % uint64(len(words))
}

func (g *gen) word(i int) string { return " " + words[g.wordIndex(i)] }

// finishReason of the last token: "length" (every simulated request runs to max_tokens),
// except a TensorRT-LLM context_only answer for a request wanting more tokens.
func (g *gen) finishReason() string {
	if g.trtContext() && g.p.asked > 1 {
		return `"not_finished"`
	}
	return `"length"`
}

func (g *gen) trtContext() bool { return g.s.cfg.Engine == EngineTRTLLM && g.p.pd.step == pdPrefill }

func (g *gen) usage(b []byte, completion int) []byte {
	pt := len(g.p.tokens)
	b = append(b, `{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(pt), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(pt+completion), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(completion), 10)
	b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
	b = strconv.AppendInt(b, int64(g.cached), 10)
	return append(b, `}}`...)
}

func (g *gen) head(b []byte, object string) []byte {
	b = append(b, `{"id":"`...)
	b = append(b, g.id...)
	b = append(b, `","object":"`...)
	b = append(b, object...)
	b = append(b, `","created":`...)
	b = strconv.AppendInt(b, g.created, 10)
	b = append(b, `,"model":`...)
	b = strconv.AppendQuote(b, g.p.req.Model)
	return b
}

// kvParams appends vLLM's top-level kv_transfer_params (other engines have none).
func (g *gen) kvParams(b []byte) []byte {
	if g.s.cfg.Engine != EngineVLLM {
		return b
	}
	b = append(b, `,"kv_transfer_params":`...)
	if g.p.pd.step != pdPrefill {
		return append(b, "null"...)
	}
	host, port, _ := net.SplitHostPort(g.s.Addr())
	b = append(b, `{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":`...)
	b = strconv.AppendQuote(b, g.s.cfg.Name)
	b = append(b, `,"remote_host":`...)
	b = strconv.AppendQuote(b, host)
	b = append(b, `,"remote_port":`...)
	b = append(b, port...)
	b = append(b, `,"remote_block_ids":[`...)
	for i, blk := range g.alloc.blocks {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(blk), 10)
	}
	return append(b, `],"tp_size":1}`...)
}

// whole writes a non-streaming response after generating every token.
func (g *gen) whole(ctx context.Context) {
	n := g.p.maxNew
	if n > 1 && !sleepCtx(ctx, time.Duration(n-1)*g.s.cfg.DecodePerToken) {
		g.s.reqErr.Add(1)
		return
	}
	var text strings.Builder
	for i := 0; i < n; i++ {
		text.WriteString(g.word(i))
	}
	var b []byte
	if g.p.chat {
		b = g.head(b, "chat.completion")
		b = append(b, `,"choices":[{"index":0,"message":{"role":"assistant","content":`...)
		b = strconv.AppendQuote(b, text.String())
		b = append(b, '}')
	} else {
		b = g.head(b, "text_completion")
		b = append(b, `,"choices":[{"index":0,"text":`...)
		b = strconv.AppendQuote(b, text.String())
	}
	b = append(b, `,"logprobs":null,"finish_reason":`...)
	b = append(b, g.finishReason()...)
	b = append(b, `,"stop_reason":null`...)
	if g.trtContext() {
		b = g.appendTRTContext(b)
	}
	b = append(b, `}],"usage":`...)
	b = g.usage(b, n)
	b = g.kvParams(b)
	if g.trtContext() {
		// TensorRT-LLM returns the prompt's ids so the generation server need not tokenize.
		b = append(b, `,"prompt_token_ids":`...)
		b = appendIDs(b, g.p.tokens)
	}
	b = append(b, '}')
	// Count before the client can see the answer: a client reading the stats right after
	// its response must find this request in them.
	g.s.reqOK.Add(1)
	g.s.genTok.Add(uint64(n))
	g.w.Header().Set("Content-Type", "application/json")
	g.w.Write(b)
}

// stream writes one SSE chunk per output token, the first right after prefill.
func (g *gen) stream(ctx context.Context) {
	w := g.w
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	fl, _ := w.(http.Flusher)
	obj := "text_completion"
	if g.p.chat {
		obj = "chat.completion.chunk"
	}
	var b []byte
	send := func() bool {
		if _, err := w.Write(b); err != nil {
			return false
		}
		if fl != nil {
			fl.Flush()
		}
		return true
	}
	if g.p.chat {
		b = append(g.head(b[:0], obj), `,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`...)
		b = append(append([]byte("data: "), b...), "\n\n"...)
		if !send() {
			g.s.reqErr.Add(1)
			return
		}
	}
	n := g.p.maxNew
	next := time.Now()
	for i := 0; i < n; i++ {
		if i > 0 {
			next = next.Add(g.s.cfg.DecodePerToken)
			if !sleepCtx(ctx, time.Until(next)) {
				g.s.reqErr.Add(1)
				return
			}
		}
		b = append(b[:0], "data: "...)
		b = g.head(b, obj)
		b = append(b, `,"choices":[{"index":0,`...)
		if g.p.chat {
			b = append(b, `"delta":{"content":`...)
			b = strconv.AppendQuote(b, g.word(i))
			b = append(b, '}')
		} else {
			b = append(b, `"text":`...)
			b = strconv.AppendQuote(b, g.word(i))
		}
		b = append(b, `,"logprobs":null,"finish_reason":`...)
		if i == n-1 {
			b = append(b, `"length","stop_reason":null}]`...)
			if g.p.pd.step == pdPrefill {
				b = g.kvParams(b)
			}
		} else {
			b = append(b, `null}]`...)
		}
		b = append(b, "}\n\n"...)
		if !send() {
			g.s.reqErr.Add(1)
			return
		}
	}
	b = b[:0]
	if o := g.p.req.StreamOptions; o != nil && o.IncludeUsage {
		b = append(b, "data: "...)
		b = g.head(b, obj)
		b = append(b, `,"choices":[],"usage":`...)
		b = g.usage(b, n)
		b = append(b, "}\n\n"...)
	}
	b = append(b, "data: [DONE]\n\n"...)
	g.s.reqOK.Add(1) // before the client can see [DONE]
	g.s.genTok.Add(uint64(n))
	send()
}

// ownedBy is each engine's ModelCard.owned_by.
var ownedBy = map[string]string{EngineVLLM: `"vllm"`, EngineSGLang: `"sglang"`, EngineTRTLLM: `"tensorrt_llm"`}

func (s *Sim) serveModels(w http.ResponseWriter, r *http.Request) {
	now := time.Now().Unix()
	var b []byte
	b = append(b, `{"object":"list","data":[`...)
	add := func(id, parent string) {
		if b[len(b)-1] != '[' {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = strconv.AppendQuote(b, id)
		b = append(b, `,"object":"model","created":`...)
		b = strconv.AppendInt(b, now, 10)
		b = append(b, `,"owned_by":`...)
		b = append(b, ownedBy[s.cfg.Engine]...)
		b = append(b, `,"root":`...)
		b = strconv.AppendQuote(b, s.cfg.Model)
		b = append(b, `,"parent":`...)
		if parent == "" {
			b = append(b, "null"...)
		} else {
			b = strconv.AppendQuote(b, parent)
		}
		b = append(b, `,"max_model_len":`...)
		b = strconv.AppendInt(b, int64(s.maxModelLen()), 10)
		b = append(b, '}')
	}
	add(s.cfg.Model, "")
	for _, l := range s.cfg.LoRAs {
		add(l, s.cfg.Model)
	}
	b = append(b, "]}"...)
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// Stats is the simulator's running totals (GET /debug/stats).
type Stats struct {
	Name         string `json:"name"`
	Requests     uint64 `json:"requests"`
	Errors       uint64 `json:"errors"`
	PromptTokens uint64 `json:"prompt_tokens"`
	CachedTokens uint64 `json:"cached_tokens"`
	OutputTokens uint64 `json:"output_tokens"`
	Running      int    `json:"running"`
	Waiting      int    `json:"waiting"`
	CachedBlocks int    `json:"cached_blocks"`
	FreeBlocks   int    `json:"free_blocks"`
}

// Stats returns the running totals.
func (s *Sim) Stats() Stats {
	run, wait := s.sched.load()
	st := s.pool.Stats()
	return Stats{Name: s.cfg.Name, Requests: s.reqOK.Load(), Errors: s.reqErr.Load(), PromptTokens: s.promptTok.Load(),
		CachedTokens: s.cachedTok.Load(), OutputTokens: s.genTok.Load(), Running: run, Waiting: wait,
		CachedBlocks: st.Cached, FreeBlocks: st.Free}
}

func (s *Sim) serveStats(w http.ResponseWriter, r *http.Request) {
	b, _ := json.Marshal(s.Stats())
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// Probe is what POST /debug/probe answers: what the engine would deliver for a request now.
type Probe struct {
	PromptTokens int `json:"prompt_tokens"`
	CachedTokens int `json:"cached_tokens"`
	Running      int `json:"running"`
	Waiting      int `json:"waiting"`
}

// ProbeRequest tokenizes and hashes an OpenAI body (chat when chat is set) and reports the
// cached tokens it would get now, without running it. The oracle placement uses it.
func (s *Sim) serveProbe(w http.ResponseWriter, r *http.Request) {
	chat := r.URL.Query().Get("api") != "completions"
	p, err := s.prepare(r.Body, chat)
	if err != nil {
		writeError(w, err)
		return
	}
	b, _ := json.Marshal(s.probe(p))
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

func (s *Sim) probe(p *prepared) Probe {
	run, wait := s.sched.load()
	return Probe{PromptTokens: len(p.tokens), CachedTokens: s.pool.Probe(p.keys, len(p.tokens)), Running: run, Waiting: wait}
}

// ProbeBody is POST /debug/probe in-process: what an OpenAI body (chat when chat is set)
// would get from the cache now.
func (s *Sim) ProbeBody(body []byte, chat bool) (Probe, error) {
	p, err := s.prepare(bytes.NewReader(body), chat)
	if err != nil {
		return Probe{}, err
	}
	return s.probe(p), nil
}

func (s *Sim) serveTRTEvents(w http.ResponseWriter, r *http.Request) {
	var b []byte
	if s.cfg.TRT != nil {
		b = s.cfg.TRT.Q.Drain(nil)
	} else {
		b = []byte("[]")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}
