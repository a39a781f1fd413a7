// Package plane is kvgate's optional NATS JetStream event plane for scale-out. Ingest
// replicas follow the engines as usual and publish the NORMALIZED events, exactly what
// they apply to their own inventory (store / remove / clear of block keys, the key kind,
// a per-endpoint seq), plus periodic per-endpoint inventory snapshots, to one stream;
// route replicas follow no engine and rebuild every endpoint's inventory from the newest
// snapshot and the stream after it. One ingest replica drains a TensorRT-LLM engine (its
// drain is destructive) and every route replica sees its events; a new or restarted route
// replica is warm as soon as it has read one snapshot and the tail behind it.
//
// The default stays direct subscription: nothing here runs unless a rule asks for it.
package plane

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvgate/kvgate/engine"
)

// Roles.
const (
	RoleIngest = "ingest" // follow the engines, publish what is applied (and route on it)
	RoleRoute  = "route"  // follow the plane only
	RoleBoth   = "both"   // as ingest: an ingest replica routes on the inventory it publishes
)

// ParseRole checks a -plane-role value.
func ParseRole(s string) (string, error) {
	switch s {
	case RoleIngest, RoleRoute, RoleBoth:
		return s, nil
	}
	return "", fmt.Errorf("plane: -plane-role %q: want ingest, route or both", s)
}

// Defaults, and why.
const (
	// DefaultStream is the JetStream stream name.
	DefaultStream = "KVGATE_EVENTS"
	// DefaultPrefix is the subject prefix: <prefix>.<endpoint>.{ev,snap,snapc}.
	DefaultPrefix = "kvgate.kv"
	// DefaultSnapshotInterval: a restarted route replica replays at most this much of the
	// stream behind the newest snapshot; 30 s of events replays in well under a second,
	// and a 1M-key endpoint's 8 MiB snapshot every 30 s is a small write load.
	DefaultSnapshotInterval = 30 * time.Second
	// DefaultMaxAge keeps 20 snapshot intervals: the newest snapshot and its tail are
	// always retained, with room for an ingest replica that was down for minutes.
	DefaultMaxAge = 10 * time.Minute
	// DefaultMaxBytes bounds the stream's disk: 16 endpoints of 1M keys snapshot 16 x 8 MiB
	// per interval, so 2 GiB holds about 15 intervals of snapshots plus their events. The
	// oldest messages go first (DiscardOld); a route replica that finds no snapshot asks
	// for one.
	DefaultMaxBytes = 2 << 30
	// DefaultMinSnapshotGap spaces snapshots of one endpoint that were asked for (a gap,
	// a reconnect, a route replica's request), so many replicas cannot make an ingest
	// replica snapshot in a loop.
	DefaultMinSnapshotGap = time.Second
	// DefaultChunkKeys keys per snapshot message: 256 KiB, under NATS's 1 MiB default
	// max_payload.
	DefaultChunkKeys = 32 << 10
	// DefaultQueue bounds the messages an ingest replica holds for publishing; beyond it
	// an op is dropped, counted, and the endpoint re-snapshotted (the ingest path never
	// waits for the plane).
	DefaultQueue = 16 << 10
)

// Config is the plane's connection and stream shape, shared by both roles.
type Config struct {
	URL    string // nats://host:port[,nats://...]
	Stream string
	Prefix string

	MaxAge   time.Duration
	MaxBytes int64
	// SnapshotInterval: ingest replicas snapshot each endpoint this often; route replicas
	// call an endpoint stale (degraded) after 3 intervals without any message for it.
	SnapshotInterval time.Duration
	MinSnapshotGap   time.Duration
	ChunkKeys        int
	Queue            int
	// ReconnectWait is the pause between reconnect attempts (default 250ms).
	ReconnectWait time.Duration

	Logger  *slog.Logger
	Metrics *metrics.Set // nil = a private set (counters still feed Status)
}

// Endpoint names one endpoint the plane carries: its name is its subject token; Index is
// its inventory slot on this replica.
type Endpoint struct {
	Name   string
	Index  int
	Engine engine.Kind
}

func (c *Config) defaults() error {
	if c.URL == "" {
		return errors.New("plane: -nats-url is empty")
	}
	for _, u := range strings.Split(c.URL, ",") {
		if !strings.HasPrefix(u, "nats://") && !strings.HasPrefix(u, "tls://") {
			return fmt.Errorf("plane: -nats-url %q: want nats://host:port", u)
		}
	}
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if strings.ContainsAny(c.Stream, ". *>") {
		return fmt.Errorf("plane: stream name %q: no dots, spaces or wildcards", c.Stream)
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if strings.ContainsAny(c.Prefix, " *>") || strings.HasPrefix(c.Prefix, ".") || strings.HasSuffix(c.Prefix, ".") {
		return fmt.Errorf("plane: subject prefix %q: no spaces, wildcards or edge dots", c.Prefix)
	}
	if c.MaxAge < 0 || c.MaxBytes < 0 || c.SnapshotInterval < 0 {
		return errors.New("plane: negative -plane-max-age, -plane-max-bytes or -plane-snapshot-interval")
	}
	if c.MaxAge == 0 {
		c.MaxAge = DefaultMaxAge
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.SnapshotInterval == 0 {
		c.SnapshotInterval = DefaultSnapshotInterval
	}
	if c.MaxAge < 2*c.SnapshotInterval {
		return fmt.Errorf("plane: -plane-max-age %v must be at least twice -plane-snapshot-interval %v, or the newest snapshot can age out", c.MaxAge, c.SnapshotInterval)
	}
	if c.MinSnapshotGap <= 0 {
		c.MinSnapshotGap = min(DefaultMinSnapshotGap, c.SnapshotInterval)
	}
	if c.ChunkKeys <= 0 {
		c.ChunkKeys = DefaultChunkKeys
	}
	if c.Queue <= 0 {
		c.Queue = DefaultQueue
	}
	if c.ReconnectWait <= 0 {
		c.ReconnectWait = 250 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = metrics.NewSet()
	}
	return nil
}

func checkEndpoints(eps []Endpoint) (byIndex int, err error) {
	names := map[string]bool{}
	maxIdx := -1
	for _, e := range eps {
		if e.Name == "" || e.Index < 0 {
			return 0, fmt.Errorf("plane: endpoint %q index %d: want a name and an index >= 0", e.Name, e.Index)
		}
		t := subjectToken(e.Name)
		if names[t] {
			return 0, fmt.Errorf("plane: endpoint name %q used twice", e.Name)
		}
		names[t] = true
		maxIdx = max(maxIdx, e.Index)
	}
	return maxIdx + 1, nil
}

// connect dials with retry: a plane that is down at start is a degraded plane, not a
// refused start. Reconnect buffering is off, so a publish while disconnected fails at
// once (and is accounted) instead of queueing unseen.
func connect(c *Config, name string, onDown func(error), onUp func(*nats.Conn)) (*nats.Conn, error) {
	return nats.Connect(c.URL,
		nats.Name(name),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(c.ReconnectWait),
		nats.ReconnectJitter(c.ReconnectWait/4, c.ReconnectWait/4),
		nats.ReconnectBufSize(-1),
		nats.PingInterval(2*time.Second), nats.MaxPingsOutstanding(2),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { onDown(err) }),
		nats.ReconnectHandler(onUp),
		nats.ConnectHandler(onUp),
	)
}

// streamConfig is the stream an ingest replica creates (or updates) on every connect.
func (c *Config) streamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        c.Stream,
		Description: "kvgate normalized KV events and inventory snapshots",
		Subjects:    []string{c.Prefix + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      c.MaxAge,
		MaxBytes:    c.MaxBytes,
		Storage:     jetstream.FileStorage,
		Replicas:    1,
	}
}

func metricName(base, ep, extra string) string {
	if extra != "" {
		return fmt.Sprintf(`%s{endpoint=%q,%s}`, base, ep, extra)
	}
	return fmt.Sprintf(`%s{endpoint=%q}`, base, ep)
}
