package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudwego/hertz/pkg/app"
	"github.com/cloudwego/hertz/pkg/app/client"
	"github.com/cloudwego/hertz/pkg/app/middlewares/server/recovery"
	"github.com/cloudwego/hertz/pkg/app/server"
	"github.com/cloudwego/hertz/pkg/common/config"
	"github.com/cloudwego/hertz/pkg/common/tracer/stats"
	"github.com/cloudwego/hertz/pkg/network/standard"

	"github.com/kvgate/kvgate/hashcore"
	"github.com/kvgate/kvgate/proxy/balance"
	"github.com/kvgate/kvgate/proxy/openai"
	"github.com/kvgate/kvgate/proxy/route"
	"github.com/kvgate/kvgate/shard"
	"github.com/kvgate/kvgate/tokenize"
)

// endpoint is one upstream engine and its live state. It holds its slot (idx) for
// its whole life in the fleet (fleet.go).
type endpoint struct {
	spec    EndpointSpec
	idx     int
	breaker *Breaker
	down    atomic.Bool // administratively drained
	healthy atomic.Bool // last active health check passed (true when checks are off)
	checked atomic.Bool // at least one health check completed
	scrape  scrapeState // engine /metrics reads for the cost policy (loadscrape.go)
	// retired: removed from the fleet (or a vacant slot's placeholder): no new request
	// picks it; requests in flight to it complete (fleet.go).
	retired atomic.Bool
	vacant  bool // a free slot's placeholder, never an engine
}

// Server is one running rule: the public proxy listener, the admin listener, the
// endpoints' state and the KV-Exact machinery when enabled.
type Server struct {
	watchClients bool // the public listener is on hertz's standard transport (clientwatch.go)
	cfg          Config
	log          *slog.Logger
	ros          atomic.Pointer[roster] // the endpoints, one per slot (fleet.go)
	fleet        *fleetCtl
	loads        *balance.Loads
	queues       *route.Queues  // prefill queued, learned rates, engine reports (the cost policy)
	meter        *decisionMeter // where traffic decisions count (meter.go)
	// fallback is -select (route.RR or route.CHWBL), labelled fallbackRoute.
	fallback      route.Selector
	fallbackRoute Route
	rr            *balance.RR
	ring          *balance.Ring
	prefRR        *balance.RR   // mode 1 prefill min-load ties
	decodeSel     *route.Decode // mode 1 decode choice
	client        *client.Client
	m             *proxyMetrics
	kv            *kvRouter
	aff           *affinity
	ranks         *rankLayout   // (endpoint, data-parallel rank) -> inventory slot (ranks.go)
	scrapeEvery   time.Duration // each endpoint's /metrics read interval (loadscrape.go scrapeInterval)

	upTLS *tls.Config // https:// upstreams (the forwarder, health, TensorRT-LLM drains)

	h        *server.Hertz
	admin    *http.Server
	adminLn  net.Listener
	publicLn net.Listener
	wg       sync.WaitGroup
	stop     context.CancelFunc
	ctx      context.Context
	ready    atomic.Bool

	conns     *connRegistry
	exchanges atomic.Uint64
	active    atomic.Int64 // handlers running
	draining  atomic.Bool
	pool      sync.Pool // *reqState
	gapWarned []atomic.Int64
	states    *stateWatcher
	// accessLogOn and adminAuth ("Bearer <token>", "" for none) change on SIGHUP (reload.go).
	accessLogOn atomic.Bool
	adminAuth   atomic.Pointer[string]
	certs       *certSource // -tls-cert/-tls-key; nil: plain HTTP
	apiKeys     *apiKeys    // -api-keys-file; nil: no key needed
}

// Options are runtime hooks that are not part of the rule.
type Options struct {
	Logger *slog.Logger
	// PublicListener and AdminListener, when set, are used instead of listening on
	// Config.Listener.Addr / AdminAddr (tests bind :0 first).
	PublicListener net.Listener
	AdminListener  net.Listener
	// Tokenizers, when set, is used instead of loading Config.Models.Tokenizers (it must hold
	// every model the rule names); tests and benchmarks share one loaded pool.
	Tokenizers *tokenize.Pool
	// Resolver, when set, answers discover=dns endpoints' lookups instead of
	// net.DefaultResolver (tests run their own DNS server).
	Resolver *net.Resolver
}

// New builds a Server from a validated Config. It loads tokenizers and sets up the
// inventory and subscribers (not yet started) when KV-Exact is on.
func New(cfg Config, opt Options) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.normalize()
	log := opt.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Server{cfg: cfg, log: log}
	s.accessLogOn.Store(cfg.Listener.AccessLog)
	s.setAdminToken(cfg.Listener.AdminToken)
	s.fleet = newFleetCtl(s, opt.Resolver)
	initial, err := s.fleet.initial()
	if err != nil {
		return nil, err
	}
	s.cfg.Fleet.Endpoints = initial
	n := slotsFor(len(initial), cfg.Fleet.MaxEndpoints)
	s.fleet.cap = n
	names := make([]string, n)
	weights := make([]int, n)
	ros := &roster{eps: make([]*endpoint, n)}
	for i := range n {
		if i >= len(initial) {
			ros.eps[i] = s.vacantEndpoint(i)
			s.fleet.free = append(s.fleet.free, i)
			continue
		}
		sp := initial[i]
		ros.eps[i] = s.newEndpoint(sp, i)
		names[i], weights[i] = sp.Name, sp.Weight
	}
	ros.setRoles()
	s.ros.Store(ros)
	s.gapWarned = make([]atomic.Int64, n)
	s.loads = balance.NewLoads(n)
	s.scrapeEvery = scrapeInterval(cfg.KV.LoadScrape, n)
	s.queues = route.NewQueues(n, cfg.KV.PrefillRate, cfg.KV.EngineSlots, 3*s.scrapeEvery)
	s.rr, s.prefRR = balance.NewRR(n), balance.NewRR(n)
	s.decodeSel = &route.Decode{Loads: s.loads, Queues: s.queues}
	s.ring = balance.NewRing(names, weights)
	s.fallback, s.fallbackRoute = &route.RR{RR: s.rr}, RouteRR
	if cfg.Select.Kind == SelectCHWBL {
		s.fallback = &route.CHWBL{Ring: s.ring, Loads: s.loads, LoadFactor: cfg.KV.LoadFactor, RR: s.rr}
		s.fallbackRoute = RouteCHWBL
	}
	s.m = newProxyMetrics(names)
	s.meter = &decisionMeter{m: s.m}
	s.aff = newAffinity(cfg.PD.AffinityTTL, cfg.PD.AffinityMax)
	cpuTier, storageTier := cfg.tiersIndexed()
	if cfg.planeRoutes() && (cfg.KV.TierWeightCPU < 1 || cfg.KV.TierWeightStorage < 1) {
		log.Warn("lower-tier blocks are not indexed on a route replica: the event plane carries the engines' GPU keys only (-kv-tier-weight-cpu and -kv-tier-weight-storage have no effect here)")
	}
	// The layout covers the whole slot table: a vacant slot is an endpoint of one rank,
	// so one added at runtime finds its tier slots laid out.
	layout := make([]EndpointSpec, n)
	copy(layout, initial)
	s.ranks = newRankLayout(layout, cpuTier, storageTier)
	if cfg.KV.Mode != KVOff && s.ranks.slots() > shard.MaxEndpoints && s.ranks.tiered {
		// Each tier doubles the inventory's slots; a fleet this wide routes on GPU blocks.
		log.Warn("lower-tier blocks are not indexed: the rule's endpoints and ranks leave no inventory slots for them (-kv-tier-weight-cpu and -kv-tier-weight-storage have no effect)",
			"candidates", s.ranks.cands, "max_slots", shard.MaxEndpoints)
		s.ranks = newRankLayout(layout, false, false)
	}
	if cfg.KV.Mode != KVOff && s.ranks.slots() > shard.MaxEndpoints {
		return nil, refuse("-endpoint", "%d endpoints with their data-parallel ranks make %d candidates; the inventory holds at most %d", n, s.ranks.slots(), shard.MaxEndpoints)
	}
	slots := s.ranks.slots()
	s.pool.New = func() any { return newReqState(slots) }
	s.conns = newConnRegistry()

	if cfg.Listener.TLSCert != "" {
		if s.certs, err = newCertSource(cfg.Listener.TLSCert, cfg.Listener.TLSKey); err != nil {
			return nil, refuse("-tls-cert", "%v", err)
		}
	}
	if cfg.Listener.APIKeysFile != "" {
		if s.apiKeys, err = newAPIKeys(cfg.Listener.APIKeysFile); err != nil {
			return nil, refuse("-api-keys-file", "%v", err)
		}
	}
	upTLS, err := upstreamTLS(&cfg)
	if err != nil {
		return nil, err
	}
	s.upTLS = upTLS
	c, err := client.NewClient(
		// First: WithTLSConfig also sets hertz's own dialer, which WithDialer replaces.
		client.WithTLSConfig(upTLS),
		// The standard (blocking) transport, not netpoll: netpoll reads every byte an
		// engine sends into memory as it arrives, so a slow client reading a fast stream
		// would grow the heap without bound. Blocking reads stop the engine instead.
		client.WithDialer(connectDialer{Dialer: standard.NewDialer(), reg: s.conns}),
		client.WithDialTimeout(cfg.Upstream.ConnectTimeout),
		client.WithClientReadTimeout(cfg.Upstream.Timeout),
		client.WithResponseBodyStream(true),
		client.WithMaxConnsPerHost(1<<16),
		client.WithMaxIdleConnDuration(90*time.Second),
		client.WithRetryConfig(),
	)
	if err != nil {
		return nil, fmt.Errorf("proxy: hertz client: %w", err)
	}
	s.client = c

	if cfg.KV.Mode != KVOff {
		kv, err := newKVRouter(s, opt.Tokenizers)
		if err != nil {
			return nil, err
		}
		s.kv = kv
		s.meter.kv, s.meter.trie = kv, kv.trie
	}
	s.states = newStateWatcher(s)
	return s, nil
}

// Start opens the listeners, starts subscribers and health checks, and serves until
// Shutdown. It returns once both listeners accept connections.
func (s *Server) Start(ctx context.Context) error {
	s.ctx, s.stop = context.WithCancel(ctx)
	ln, err := net.Listen("tcp", s.cfg.Listener.Addr)
	if err != nil {
		return fmt.Errorf("-listen %s: %w", s.cfg.Listener.Addr, err)
	}
	s.publicLn = ln
	return s.start()
}

// StartWith is Start with listeners the caller opened (tests bind 127.0.0.1:0).
func (s *Server) StartWith(ctx context.Context, public, admin net.Listener) error {
	s.ctx, s.stop = context.WithCancel(ctx)
	s.publicLn, s.adminLn = public, admin
	return s.start()
}

func (s *Server) start() error {
	if s.adminLn == nil && s.cfg.Listener.AdminAddr != "" {
		ln, err := net.Listen("tcp", s.cfg.Listener.AdminAddr)
		if err != nil {
			s.publicLn.Close()
			return fmt.Errorf("-admin-listen %s: %w", s.cfg.Listener.AdminAddr, err)
		}
		s.adminLn = ln
	}
	s.logRule()
	if s.kv != nil {
		if err := s.kv.start(s.ctx); err != nil {
			return err
		}
		s.every(s.states.tun.every, func() { s.states.evaluate(time.Now()) })
	}
	if s.cfg.Health.Interval > 0 {
		s.wg.Add(1)
		go s.healthLoop()
	}
	if s.cfg.KV.Mode != KVOff && s.cfg.KV.LoadScrape > 0 {
		s.wg.Add(1)
		go s.scrapeLoop()
	}
	opts := []config.Option{
		server.WithListener(s.publicLn),
		server.WithStreamBody(true),
		// netpoll's transport senses a client that leaves (its poller sees the hang-up);
		// TLS switches hertz to its standard transport, where clientwatch.go does.
		server.WithSenseClientDisconnection(true),
		server.WithDisablePrintRoute(true),
		server.WithExitWaitTime(s.cfg.Shutdown.Grace),
		server.WithMaxHeaderBytes(s.cfg.Limits.MaxHeaderBytes),
		server.WithIdleTimeout(120 * time.Second),
		// Only to answer hertz's own refusals as JSON (headerrors.go); no trace stats.
		server.WithTracer(&headErrors{s: s}),
		server.WithTraceLevel(stats.LevelDisabled),
	}
	if s.certs != nil {
		opts = append(opts, server.WithTLS(s.certs.serverTLS()))
		s.watchClients = true
	}
	s.h = server.New(opts...)
	s.h.NoHijackConnPool = true
	// hertz parses the request target lazily, in its router, before any middleware: a
	// target like "A:0" without a Host header panics there (hertz v0.10.4 splitHostURI).
	// Answer 400 and close instead of dropping the connection silently.
	s.h.PanicHandler = func(ctx context.Context, c *app.RequestContext) {
		disarmHeadErrors(c) // kvgate writes this answer
		s.m.bad[BadTarget].Inc()
		writeError(c, 400, "invalid_request_error", "malformed request target")
		c.SetConnectionClose()
	}
	if s.certs != nil || s.apiKeys != nil {
		s.every(time.Second, s.reloadFiles)
	}
	if s.cfg.Fleet.EndpointsFile != "" && s.cfg.Fleet.EndpointsWatch > 0 {
		// Polling (not inotify) sees every kind of change on every filesystem, a
		// Kubernetes ConfigMap's symlink swap included; the content hash makes a rewrite
		// of the same size and mtime count, and a touch without change not.
		s.every(s.cfg.Fleet.EndpointsWatch, func() { s.reloadEndpointsFile() }) //nolint:errcheck // WARNed
	}
	if s.cfg.Fleet.DNSInterval > 0 {
		s.every(s.cfg.Fleet.DNSInterval, s.dnsTicker())
	}
	s.routes()
	errc := make(chan error, 1)
	go func() { errc <- s.h.Run() }()
	if s.adminLn != nil {
		s.admin = &http.Server{Handler: s.adminHandler(), ReadHeaderTimeout: 10 * time.Second}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.admin.Serve(s.adminLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("admin listener", "err", err)
			}
		}()
	}
	// Wait until hertz serves (or failed).
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-errc:
			return fmt.Errorf("-listen: %w", err)
		default:
		}
		if s.h.IsRunning() {
			s.ready.Store(true)
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return errors.New("proxy: server did not start within 5s")
}

// PublicAddr and AdminAddr are the bound listener addresses.
func (s *Server) PublicAddr() string { return s.publicLn.Addr().String() }

// AdminAddr is the admin listener's address ("" when disabled).
func (s *Server) AdminAddr() string {
	if s.adminLn == nil {
		return ""
	}
	return s.adminLn.Addr().String()
}

// BeginDrain is the first step of a rolling-deploy shutdown: /readyz answers 503 from
// now on and answers carry Connection: close, while the public listener keeps serving
// (the caller waits -shutdown-delay, then calls Shutdown).
func (s *Server) BeginDrain() {
	if !s.draining.Swap(true) {
		s.log.Warn("draining: /readyz answers 503, still serving until the drain delay ends", "delay", s.cfg.Shutdown.Delay)
	}
}

// Shutdown stops accepting, lets in-flight requests finish within ctx (or the
// configured grace), then stops subscribers and health checks. Keep-alive connections
// idle between requests do not hold it up: once no handler runs, it proceeds.
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	s.draining.Store(true)
	if s.h != nil {
		drained, cancel := context.WithCancel(ctx)
		go func() {
			defer cancel()
			t := time.NewTicker(20 * time.Millisecond)
			defer t.Stop()
			for s.active.Load() > 0 {
				select {
				case <-drained.Done():
					return
				case <-t.C:
				}
			}
			// Let the last responses flush before connections go.
			time.Sleep(20 * time.Millisecond)
		}()
		err = s.h.Shutdown(drained)
		if errors.Is(err, context.Canceled) && ctx.Err() == nil {
			err = nil
		}
		cancel()
	}
	if s.admin != nil {
		s.admin.Shutdown(ctx) //nolint:errcheck
	}
	if s.stop != nil {
		s.stop()
	}
	if s.kv != nil {
		s.kv.close()
	}
	s.wg.Wait()
	s.client.CloseIdleConnections()
	return err
}

// track counts a running handler; while draining, responses close their connection.
func (s *Server) track(c *app.RequestContext) func() {
	s.active.Add(1)
	if s.draining.Load() {
		c.SetConnectionClose()
	}
	return func() { s.active.Add(-1) }
}

func (s *Server) routes() {
	// First: a request that got this far is answered by kvgate, not hertz (headerrors.go).
	s.h.Use(func(ctx context.Context, c *app.RequestContext) {
		disarmHeadErrors(c)
		c.Next(ctx)
	})
	// A bug must cost one request, never the process.
	s.h.Use(recovery.Recovery(recovery.WithRecoveryHandler(func(ctx context.Context, c *app.RequestContext, err any, stack []byte) {
		s.log.Error("panic serving request", "err", err, "stack", string(stack))
		writeError(c, 500, "internal_error", "kvgate internal error")
	})))
	if s.apiKeys != nil {
		s.h.Use(func(ctx context.Context, c *app.RequestContext) {
			if !s.checkAPIKey(c) {
				c.Abort()
				return
			}
			c.Next(ctx)
		})
	}
	s.h.POST("/v1/completions", func(ctx context.Context, c *app.RequestContext) { s.handleOpenAI(ctx, c, false) })
	s.h.POST("/v1/chat/completions", func(ctx context.Context, c *app.RequestContext) { s.handleOpenAI(ctx, c, true) })
	// vLLM's Responses API: keyed as the conversation the engine renders (fields.go). The
	// prefill/decode protocols rewrite completions and chat bodies only, so in mode 1 it
	// passes through to an endpoint by -select.
	s.h.POST("/v1/responses", func(ctx context.Context, c *app.RequestContext) {
		if s.cfg.KV.Mode == KVDisaggregated {
			s.handlePassThrough(ctx, c)
			return
		}
		s.handleOpenAI(ctx, c, true)
	})
	s.h.NoRoute(func(ctx context.Context, c *app.RequestContext) { s.handlePassThrough(ctx, c) })
	s.h.NoMethod(func(ctx context.Context, c *app.RequestContext) { s.handlePassThrough(ctx, c) })
}

// reqState is the per-request scratch, pooled so steady-state routing allocates nothing.
type reqState struct {
	watch clientWatch // senses a client that leaves mid-request (clientwatch.go)
	// body is the request body: hertz's own buffer when hertz read it whole (valid until
	// the handler returns, which is as long as st lives), else bodyBuf's bytes.
	body     []byte
	bodyBuf  []byte // kvgate's pooled buffer for bodies it reads from a stream
	oa       openai.Request
	chat     bool
	text     []byte
	tokens   []uint32
	keys     []uint64
	fastKeys []uint64
	// trieEngine: the prefix trie takes the request's keys in the rule's engine contract
	// (trieKeys).
	trieEngine bool
	scores     []int32
	scores2    []int32
	scores3    []int32
	matched    []int32 // blocks held per endpoint as the policy sees them (inventory, then pending)
	tierCPU    []int32 // of matched, blocks only a lower tier holds (ranks.go foldTiers)
	tierSto    []int32
	cand       route.Candidates
	obs        route.Observer // /debug/explain's recorder; nil for traffic
	meter      *decisionMeter // the server's for traffic; nil for /debug/explain
	// What this decision took from the memos (/debug/explain).
	memoUse    tokenize.MemoUse
	renderUse  tokenize.RenderUse
	memoBlocks int
	eligible   shard.Mask
	excluded   shard.Mask
	scratch    shard.Mask
	out        []byte
	relay      []byte
	tail       []byte
	sessKey    []byte
	legA       []byte
	legB       []byte
	legResp    []byte
	salt       []byte
	ex         hashcore.Extras
	engMask    shard.Mask
	fastMask   shard.Mask
	recMask    shard.Mask // the one slot whose pending keys trieRecord scores
	slotEl     shard.Mask // the eligible endpoints' inventory slots (data-parallel ranks)
	// groups are the eligible endpoints under neither the rule's contract nor its fast
	// chain (another block size or engine), one per chain; ngroups are in use. Reused.
	groups  []keyGroup
	ngroups int
	// canRetry: this attempt's 5xx or truncated answer may be dropped for another
	// endpoint (nothing has reached the client; attempts and an alternative remain).
	canRetry bool
	// routeStart is when parsing began: the first decision records the whole routing
	// overhead (steps 1-5) from it in kvgate_route_seconds.
	routeStart time.Time
	// arrived is when the handler began (before the body was read): answers' duration
	// and TTFT count from it.
	arrived time.Time
	// cached is the engine's cached-token receipt for this answer (-1: none).
	cached int64
}

// keyGroup is one chain some eligible endpoints' keys are under, their slots and the
// prompt's keys in that chain.
type keyGroup struct {
	chain hashcore.Chain
	mask  shard.Mask
	keys  []uint64
}

// group is the request's key group for chain c, taken into use (its mask cleared) the
// first time c is asked for; group masks and key buffers are reused across requests.
func (st *reqState) group(c hashcore.Chain) *keyGroup {
	for g := range st.groups[:st.ngroups] {
		if st.groups[g].chain == c {
			return &st.groups[g]
		}
	}
	if st.ngroups == len(st.groups) {
		st.groups = append(st.groups, keyGroup{mask: shard.NewMask(len(st.scores))})
	}
	g := &st.groups[st.ngroups]
	st.ngroups++
	g.chain = c
	clear(g.mask)
	return g
}

func newReqState(n int) *reqState {
	return &reqState{
		bodyBuf:  make([]byte, 0, 16<<10),
		scores:   make([]int32, n),
		scores2:  make([]int32, n),
		scores3:  make([]int32, n),
		matched:  make([]int32, n),
		tierCPU:  make([]int32, n),
		tierSto:  make([]int32, n),
		eligible: shard.NewMask(n),
		excluded: shard.NewMask(n),
		scratch:  shard.NewMask(n),
		engMask:  shard.NewMask(n),
		fastMask: shard.NewMask(n),
		recMask:  shard.NewMask(n),
		slotEl:   shard.NewMask(n),
		relay:    make([]byte, 8<<10), // held per open stream: SSE events are small
	}
}

func (st *reqState) reset() {
	st.body = nil
	st.chat = false
	st.canRetry = false
	st.cached = -1
	clear(st.excluded)
	st.tail = st.tail[:0]
	st.keys, st.fastKeys = st.keys[:0], st.fastKeys[:0] // a request kv.route never saw has none
	st.memoUse, st.memoBlocks, st.renderUse = tokenize.MemoUse{}, 0, tokenize.RenderUse{}
	st.ngroups = 0
}

func (s *Server) getState() *reqState {
	st := s.pool.Get().(*reqState)
	st.reset()
	st.meter, st.obs = s.meter, nil
	return st
}

func (s *Server) putState(st *reqState) {
	st.body = nil                // hertz reuses its buffer once the handler returns
	if cap(st.bodyBuf) > 4<<20 { // do not pin huge bodies in the pool
		st.bodyBuf = make([]byte, 0, 16<<10)
	}
	if cap(st.tokens) > 1<<18 || cap(st.out) > 4<<20 || cap(st.text) > 4<<20 { // nor huge prompts' scratch
		st.tokens, st.keys, st.fastKeys, st.out, st.text = nil, nil, nil, nil, nil
	}
	s.pool.Put(st)
}

// readBody reads the request body into st.body, refusing more than the limit.
func (s *Server) readBody(c *app.RequestContext, st *reqState) (ok bool) {
	limit := s.cfg.Limits.MaxBodyBytes
	if !s.checkFraming(c) {
		return false
	}
	if cl := c.Request.Header.ContentLength(); cl > limit {
		s.m.bad[BadTooLarge].Inc()
		writeError(c, 413, "invalid_request_error", "request body exceeds the limit of "+itoa(limit)+" bytes")
		// The unread body stays on the connection: close it rather than read it.
		closeUnread(c)
		return false
	}
	if !c.Request.IsBodyStream() {
		b := c.Request.Body()
		if len(b) > limit {
			s.m.bad[BadTooLarge].Inc()
			writeError(c, 413, "invalid_request_error", "request body exceeds the limit of "+itoa(limit)+" bytes")
			return false
		}
		// Borrowed, not copied (a 4k-token chat body is ~28 KB): nothing writes to the
		// body, and hertz keeps its buffer until the handler returns.
		st.body = b
		return true
	}
	var err error
	st.bodyBuf, err = appendBody(st.bodyBuf[:0], c.Request.BodyStream(), limit)
	st.body = st.bodyBuf
	switch {
	case err == errBodyTooLarge:
		s.m.bad[BadTooLarge].Inc()
		writeError(c, 413, "invalid_request_error", "request body exceeds the limit of "+itoa(limit)+" bytes")
		closeUnread(c)
		return false
	case err != nil:
		s.m.bad[BadReadBody].Inc()
		writeError(c, 400, "invalid_request_error", "reading request body: "+err.Error())
		c.SetConnectionClose()
		return false
	}
	return true
}

func (s *Server) handleOpenAI(ctx context.Context, c *app.RequestContext, chat bool) {
	defer s.track(c)()
	st := s.getState()
	defer s.putState(st)
	st.arrived = time.Now()
	if !s.readBody(c, st) {
		return
	}
	ctx = s.watchClient(ctx, c, st)
	defer st.watch.stop()
	st.chat = chat
	t0 := time.Now()
	st.routeStart = t0
	if err := openai.Scan(st.body, &st.oa); err != nil {
		s.m.bad[BadJSON].Inc()
		writeError(c, 400, "invalid_request_error", "malformed request body: "+err.Error())
		return
	}
	s.m.stage[StageParse].UpdateDuration(t0)
	if s.cfg.KV.Mode == KVDisaggregated {
		s.servePD(ctx, c, st)
		return
	}
	s.tries(ctx, c, st, openAIPath)
}

func (s *Server) handlePassThrough(ctx context.Context, c *app.RequestContext) {
	defer s.track(c)()
	st := s.getState()
	defer s.putState(st)
	st.arrived = time.Now()
	if !s.readBody(c, st) {
		return
	}
	ctx = s.watchClient(ctx, c, st)
	defer st.watch.stop()
	st.oa.Reset()
	st.routeStart = time.Now()
	s.tries(ctx, c, st, passThroughPath)
}

func passThroughKey(c *app.RequestContext) []byte { return c.Request.URI().Path() }

// hasAlternative says another endpoint could take this request if ep's answer is
// thrown away (a 5xx or a truncated body, before any byte reached the client).
func (s *Server) hasAlternative(st *reqState, ep int) bool {
	for i, e := range s.roster().eps {
		if i != ep && !st.excluded.Has(i) && !e.retired.Load() && !e.down.Load() && e.healthy.Load() && e.breaker.Ready() {
			return true
		}
	}
	return false
}

// every runs f each interval on its own goroutine until the server stops (the periodic
// watchers: routing states, certificate and key files, the endpoints file, DNS).
func (s *Server) every(interval time.Duration, f func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-s.ctx.Done():
				return
			case <-t.C:
			}
			f()
		}
	}()
}
