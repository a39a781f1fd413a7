package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/bench/enginesim"
	"github.com/kvgate/kvgate/internal/freeport"
)

// Target decides where one request goes: the base URL (http://host:port) of kvgate or of
// an engine.
type Target interface {
	Route(body []byte, chat bool) (string, error)
}

// fixedTarget sends everything to one URL (kvgate).
type fixedTarget string

func (f fixedTarget) Route([]byte, bool) (string, error) { return string(f), nil }

// Env is what a policy gets to start from: the engines of this run.
type Env struct {
	Sims []*enginesim.Sim
	// Remote are engines running outside this process (used instead of Sims when set).
	Remote []RemoteEngine
	// Engine, BlockSize, HashAlgo, HashSeed, SeedSet, Model, Tokenizer describe the sims
	// (a router must be configured with the same contract).
	Engine, HashAlgo, HashSeed, Model, Tokenizer string
	SeedSet                                      bool
	BlockSize                                    int
	// Kvgate is the kvgate binary; KvgateArgs are extra serve flags.
	Kvgate     string
	KvgateArgs []string
	// Replicas is how many `kvgate serve` processes a kvgate policy runs (default 1), each
	// subscribed to every engine; clients (sessions) are spread over them round-robin.
	Replicas int
}

// RemoteEngine is an engine in another process: its base URL and event PUB address.
type RemoteEngine struct{ URL, Events string }

func (env *Env) engines() []RemoteEngine {
	if len(env.Remote) > 0 {
		return env.Remote
	}
	out := make([]RemoteEngine, len(env.Sims))
	for i, s := range env.Sims {
		out[i] = RemoteEngine{URL: s.URL(), Events: s.EventsAddr()}
	}
	return out
}

// Policy is one routing choice under test. Start returns the target and a stop function
// that must release everything Start started.
type Policy struct {
	Name string
	// Flags are the `kvgate serve` routing flags of a kvgate policy (nil for the others).
	Flags []string
	Start func(ctx context.Context, env *Env) (Target, func() error, error)
}

// KvgatePolicy runs `kvgate serve` with the given routing flags in front of the sims.
// withEvents subscribes it to every sim's KV events (KV-Exact needs them).
func KvgatePolicy(name string, withEvents bool, flags ...string) Policy {
	return Policy{Name: name, Flags: flags, Start: func(ctx context.Context, env *Env) (Target, func() error, error) {
		return startKvgate(ctx, env, withEvents, flags)
	}}
}

// StandardPolicies are the comparisons the issue asks for: round-robin, CHWBL, KV-Exact
// mode 3 as shipped (every default: the cost policy), KV-Exact pinned to the overlap argmax
// with both scorers (what mode 3 did before the cost policy), and the oracle placement.
func StandardPolicies() []Policy {
	return []Policy{
		KvgatePolicy("rr", false, "-select", "rr", "-kv-mode", "off"),
		KvgatePolicy("chwbl", false, "-select", "chwbl", "-kv-mode", "off"),
		KvgatePolicy("kv-exact", true, "-kv-mode", "3"),
		KvgatePolicy("kv-exact-overlap", true, "-select", "rr", "-kv-mode", "3", "-kv-policy", "overlap", "-kv-score", "overlap"),
		KvgatePolicy("kv-exact-prefix", true, "-select", "rr", "-kv-mode", "3", "-kv-policy", "overlap", "-kv-score", "prefix"),
		OraclePolicy(),
	}
}

// DefaultPolicies is the -policies default of `kvgate bench`.
const DefaultPolicies = "rr,chwbl,kv-exact,kv-exact-overlap,kv-exact-prefix,oracle"

// PolicyByName returns a standard policy, "direct-rr" (round-robin in the harness, no
// kvgate: for when no kvgate binary is available) or "oracle".
func PolicyByName(name string) (Policy, bool) {
	if name == "direct-rr" {
		return DirectRRPolicy(), true
	}
	for _, p := range StandardPolicies() {
		if p.Name == name {
			return p, true
		}
	}
	return Policy{}, false
}

// freePort picks a loopback port for a child process (internal/freeport: below the
// ephemeral range, so no outgoing connection takes it before the child binds it).
func freePort() (string, error) { return freeport.Addr() }

// syncBuffer collects a child's output for error messages.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b.Len() > 64<<10 {
		return len(p), nil
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// ServeArgs are the `kvgate serve` flags for env's engines plus the policy flags.
func ServeArgs(env *Env, listen, admin string, withEvents bool, flags []string) []string {
	args := []string{"serve", "-listen", listen, "-admin-listen", admin}
	for i, e := range env.engines() {
		ep := fmt.Sprintf("name=e%d,url=%s,engine=%s,role=both", i, e.URL, env.Engine)
		if withEvents && e.Events != "" {
			ep += ",events=" + e.Events
		}
		args = append(args, "-endpoint", ep)
	}
	if env.Model != "" && env.Tokenizer != "" {
		args = append(args, "-model", env.Model, "-tokenizer", env.Tokenizer)
	}
	if withEvents {
		args = append(args, "-kv-block-size", fmt.Sprint(env.BlockSize))
		if env.HashAlgo != "" {
			args = append(args, "-kv-hash-algo", env.HashAlgo)
		}
		if env.SeedSet {
			args = append(args, "-kv-hash-seed", env.HashSeed)
		}
	}
	args = append(args, env.KvgateArgs...)
	return append(args, flags...)
}

func startKvgate(ctx context.Context, env *Env, withEvents bool, flags []string) (Target, func() error, error) {
	n := max(env.Replicas, 1)
	var targets []Target
	var stops []func() error
	stopAll := func() error {
		var errs []error
		for _, stop := range stops {
			errs = append(errs, stop())
		}
		return errors.Join(errs...)
	}
	for r := 0; r < n; r++ {
		admin, err := freePort()
		if err != nil {
			stopAll()
			return nil, nil, err
		}
		t, stop, err := startKvgateAt(ctx, env, withEvents, flags, admin)
		if err != nil {
			stopAll()
			return nil, nil, err
		}
		stops = append(stops, stop)
		targets = append(targets, t)
		if withEvents && n > 1 {
			// The engines already have replica 0 as a subscriber, so WaitSubscribed says
			// nothing about this one: wait until it reports every endpoint connected.
			if err := waitEventsConnected(ctx, "http://"+admin+"/metrics", len(env.engines()), 15*time.Second); err != nil {
				stopAll()
				return nil, nil, fmt.Errorf("kvgate replica %d: %w", r, err)
			}
		}
	}
	if n == 1 {
		return targets[0], stopAll, nil
	}
	rt := &replicaTarget{}
	for _, t := range targets {
		rt.replicas = append(rt.replicas, &countedTarget{Target: t})
	}
	return rt, stopAll, nil
}

// waitEventsConnected polls a kvgate /metrics until n endpoints report
// kvgate_ingest_connected 1, then allows the subscription message a moment to reach the
// engines (ZeroMQ sends it right after the connection).
func waitEventsConnected(ctx context.Context, metricsURL string, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		up := 0
		scrapeLines(metricsURL, func(l string) {
			if strings.HasPrefix(l, "kvgate_ingest_connected{") && strings.HasSuffix(l, " 1") {
				up++
			}
		})
		if up >= n {
			return sleepCtx(ctx, 100*time.Millisecond)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d endpoints' events connected after %v", up, n, timeout)
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if !sleepUntil(ctx, time.Now().Add(d)) {
		return ctx.Err()
	}
	return nil
}

// replicaTarget is several kvgate replicas behind a client-side round-robin: each client
// (session) talks to one replica, the way an L4 balancer pins a connection.
type replicaTarget struct {
	replicas []*countedTarget
	next     atomic.Uint64
}

func (r *replicaTarget) Route(body []byte, chat bool) (string, error) {
	return r.replicas[(r.next.Add(1)-1)%uint64(len(r.replicas))].Route(body, chat)
}

// ForSession is the replica client number i uses.
func (r *replicaTarget) ForSession(i int) Target { return r.replicas[i%len(r.replicas)] }

// Routed is how many requests went to each replica.
func (r *replicaTarget) Routed() []int64 {
	out := make([]int64, len(r.replicas))
	for i, c := range r.replicas {
		out[i] = c.n.Load()
	}
	return out
}

// countedTarget counts the requests routed through it.
type countedTarget struct {
	Target
	n atomic.Int64
}

func (c *countedTarget) Route(body []byte, chat bool) (string, error) {
	c.n.Add(1)
	return c.Target.Route(body, chat)
}

// sessionTarget is a Target that gives each client (session) its own Target.
type sessionTarget interface {
	ForSession(i int) Target
}

// startKvgateAt runs kvgate serve with its admin listener on admin, waits until it is
// ready (and subscribed to every engine's events when withEvents), and returns its URL.
func startKvgateAt(ctx context.Context, env *Env, withEvents bool, flags []string, admin string) (Target, func() error, error) {
	if env.Kvgate == "" {
		return nil, nil, fmt.Errorf("no kvgate binary to run")
	}
	listen, err := freePort()
	if err != nil {
		return nil, nil, err
	}
	args := ServeArgs(env, listen, admin, withEvents, flags)
	// Ready: the admin /readyz answers 200.
	stop, err := startChild(ctx, env.Kvgate, args, "http://"+admin+"/readyz")
	if err != nil {
		return nil, nil, fmt.Errorf("kvgate: %w", err)
	}
	fail := func(err error) (Target, func() error, error) {
		stop()
		return nil, nil, fmt.Errorf("kvgate %s: %v", strings.Join(args, " "), err)
	}
	if withEvents {
		// ZeroMQ PUB drops what it sends before a subscriber joined: wait for kvgate's.
		for _, s := range env.Sims {
			if err := s.WaitSubscribed(ctx, 15*time.Second); err != nil {
				return fail(fmt.Errorf("engine %s: no event subscriber: %v", s.Config().Name, err))
			}
		}
	}
	return fixedTarget("http://" + listen), stop, nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// DirectRRPolicy is round-robin done by the harness itself, without kvgate.
func DirectRRPolicy() Policy {
	return Policy{Name: "direct-rr", Start: func(ctx context.Context, env *Env) (Target, func() error, error) {
		urls := make([]string, len(env.Sims))
		for i, s := range env.Sims {
			urls[i] = s.URL()
		}
		return &rrTarget{urls: urls}, func() error { return nil }, nil
	}}
}

type rrTarget struct {
	urls []string
	n    atomic.Uint64
}

func (r *rrTarget) Route([]byte, bool) (string, error) {
	return r.urls[(r.n.Add(1)-1)%uint64(len(r.urls))], nil
}
