package proxy

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/kvgate/kvgate/engine"
	"github.com/kvgate/kvgate/hashcore"
	"github.com/kvgate/kvgate/ingest"
	"github.com/kvgate/kvgate/ingest/plane"
)

// PlaneConfig is the optional NATS JetStream event plane (package ingest/plane). The
// default is direct subscription: every replica follows every engine itself.
type PlaneConfig struct {
	Kind    string // -events-plane: "" or direct | jetstream
	Role    string // -plane-role: ingest | route | both ("" = both)
	NATSURL string // -nats-url
	Stream  string // -plane-stream
	// Retention and snapshots; 0 takes the plane's documented defaults.
	MaxAge           time.Duration // -plane-max-age
	MaxBytes         int64         // -plane-max-bytes
	SnapshotInterval time.Duration // -plane-snapshot-interval
}

func (p *PlaneConfig) on() bool { return p.Kind == "jetstream" }

// planeRoutes reports whether this replica follows the plane instead of the engines.
func (c *Config) planeRoutes() bool { return c.Plane.on() && c.Plane.Role == plane.RoleRoute }

func (c *Config) validatePlane() error {
	p := &c.Plane
	switch p.Kind {
	case "", "direct":
		if p.Role != "" || p.NATSURL != "" {
			return refuse("-events-plane", "-plane-role and -nats-url need -events-plane jetstream")
		}
		return nil
	case "jetstream":
	default:
		return refuse("-events-plane", "%q: want direct or jetstream", p.Kind)
	}
	if c.KV.Mode == KVOff {
		return refuse("-events-plane", "the event plane carries KV events: it needs -kv-mode 3 or 1")
	}
	for _, e := range c.Fleet.Endpoints {
		if e.DP > 1 {
			return refuse("-events-plane", "endpoint %q: dp=%d: the event plane carries one stream per endpoint, not per data-parallel rank; follow it directly (-events-plane direct)", e.Name, e.DP)
		}
	}
	if _, err := plane.ParseRole(p.Role); p.Role != "" && err != nil { // "": both
		return refuse("-plane-role", "%q: want ingest, route or both", p.Role)
	}
	if p.NATSURL == "" {
		return refuse("-nats-url", "-events-plane jetstream needs -nats-url nats://host:port")
	}
	for _, u := range strings.Split(p.NATSURL, ",") {
		if !strings.HasPrefix(u, "nats://") && !strings.HasPrefix(u, "tls://") {
			return refuse("-nats-url", "%q: want nats://host:port (comma-separated for a cluster)", u)
		}
	}
	if strings.ContainsAny(p.Stream, ". *>") {
		return refuse("-plane-stream", "%q: a JetStream stream name has no dots, spaces or wildcards", p.Stream)
	}
	if p.MaxAge < 0 || p.MaxBytes < 0 || p.SnapshotInterval < 0 {
		return refuse("-plane-max-age", "-plane-max-age, -plane-max-bytes and -plane-snapshot-interval must be >= 0 (0: default)")
	}
	age, iv := p.MaxAge, p.SnapshotInterval
	if age == 0 {
		age = plane.DefaultMaxAge
	}
	if iv == 0 {
		iv = plane.DefaultSnapshotInterval
	}
	if age < 2*iv {
		return refuse("-plane-max-age", "%v must be at least twice -plane-snapshot-interval (%v), or the newest snapshot can age out of the stream", age, iv)
	}
	return nil
}

// eventSource is what the KV router reads of whatever keeps its inventory in step with
// the engines: ingest's subscribers (direct, or publishing to the plane) or the plane.
type eventSource interface {
	Start(ctx context.Context) error
	Close() error
	Status(i int) ingest.EndpointStatus
	UsesFastKeys(i int) bool
	// KeyGen moves whenever what UsesFastKeys or Contract answers for any endpoint may
	// have changed (kvRouter.slotKeys keeps its classification until it does).
	KeyGen() uint64
	// Contract is the chains endpoint i's keys are under (its engine's, kvgate's fast
	// one at its block size); nil, nil: the rule's.
	Contract(i int) (engine, fast hashcore.Chain)
	// Redial cuts endpoint i's reconnect backoff short (its health just came back).
	Redial(i int)
}

// directSource is the default: this replica's own subscribers.
type directSource struct{ *ingest.Manager }

func (d directSource) Start(ctx context.Context) error { d.Manager.Start(ctx); return nil }

// ingestSource follows the engines and publishes what it applies to the plane.
type ingestSource struct {
	*ingest.Manager
	g *plane.Ingest
}

func (p ingestSource) Start(ctx context.Context) error {
	if err := p.g.Start(ctx); err != nil {
		return &FlagError{Flag: "-nats-url", Msg: err.Error()}
	}
	p.Manager.Start(ctx)
	return nil
}

func (p ingestSource) Close() error {
	p.Manager.Close()
	return p.g.Close()
}

// routeSource follows the plane only.
type routeSource struct{ *plane.Route }

// Redial: a route replica follows no engine; the plane reconnects on its own.
func (p routeSource) Redial(int) {}

// Contract: a route replica keys every endpoint under the rule's contract (the plane
// carries no adopted block sizes).
func (p routeSource) Contract(int) (engine, fast hashcore.Chain) { return nil, nil }

func (p routeSource) Start(ctx context.Context) error {
	if err := p.Route.Start(ctx); err != nil {
		return &FlagError{Flag: "-nats-url", Msg: err.Error()}
	}
	return nil
}

func (k *kvRouter) planeConfig() plane.Config {
	p := &k.s.cfg.Plane
	return plane.Config{URL: p.NATSURL, Stream: p.Stream, MaxAge: p.MaxAge, MaxBytes: p.MaxBytes,
		SnapshotInterval: p.SnapshotInterval, Logger: k.s.log, Metrics: k.s.m.set}
}

// newEventSource builds the rule's event source from -events-plane and -plane-role.
// Route replicas build no ingest.Manager: they follow no engine, so they need no events=
// address (and never drain a TensorRT-LLM engine).
func (k *kvRouter) newEventSource(icfg ingest.Config, eps []ingest.EndpointConfig) (eventSource, error) {
	pc := &k.s.cfg.Plane
	if !pc.on() {
		m, err := ingest.NewManager(icfg, eps)
		if err != nil {
			return nil, refuse("-endpoint", "%v", err)
		}
		return directSource{m}, nil
	}
	peps := make([]plane.Endpoint, len(eps))
	for i, e := range eps {
		peps[i] = plane.Endpoint{Name: e.Name, Index: e.Index, Engine: e.Engine}
	}
	if pc.Role == plane.RoleRoute {
		r, err := plane.NewRoute(k.planeConfig(), k.inv, peps)
		if err != nil {
			return nil, refuse("-events-plane", "%v", err)
		}
		if err := armFallback(r, icfg, eps); err != nil {
			return nil, err
		}
		return routeSource{r}, nil
	}
	g, err := plane.NewIngest(k.planeConfig(), k.inv, peps)
	if err != nil {
		return nil, refuse("-events-plane", "%v", err)
	}
	icfg.Inventory = g
	m, err := ingest.NewManager(icfg, eps)
	if err != nil {
		return nil, refuse("-endpoint", "%v", err)
	}
	g.SetKeyKind(m.UsesFastKeys)
	return ingestSource{Manager: m, g: g}, nil
}

// planeState is endpoint i's event-plane state for /debug/inventory ("" without a plane).
func (k *kvRouter) planeState(i int) string {
	switch src := k.mgr.(type) {
	case routeSource:
		st, why := src.State(i)
		if why != "" {
			return fmt.Sprintf("route: %s (%s)", st, why)
		}
		return "route: " + st
	case ingestSource:
		switch {
		case src.g.Publishing():
			return "ingest: publishing"
		case src.g.Connected():
			return "ingest: degraded (no event stream: cannot create it, events are not shared)"
		}
		return "ingest: degraded (plane down: events are not shared)"
	}
	return ""
}

// armFallback lets a route replica follow, while the plane is down, the engines whose
// events= it was given. TensorRT-LLM endpoints are never followed directly: their drain
// is destructive and belongs to the ingest replica. The fallback's counters are private
// (a fresh Manager each outage); the plane's metrics and /debug/inventory show it.
func armFallback(r *plane.Route, icfg ingest.Config, eps []ingest.EndpointConfig) error {
	var sub []ingest.EndpointConfig
	covers := make([]bool, len(eps))
	for _, e := range eps {
		if e.Events != "" && e.Engine != engine.TRTLLM {
			sub = append(sub, e)
			covers[e.Index] = true
		}
	}
	if len(sub) == 0 {
		return nil
	}
	icfg.Metrics = nil
	icfg.OnKeysChange = r.KeysChanged
	if _, err := ingest.NewManager(icfg, sub); err != nil { // validates now, not mid-outage
		return refuse("-endpoint", "%v", err)
	}
	r.SetFallback(&plane.Fallback{Covers: covers, New: func() (plane.Source, error) {
		return ingest.NewManager(icfg, sub)
	}})
	return nil
}
