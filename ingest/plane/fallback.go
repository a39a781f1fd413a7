package plane

import (
	"context"
	"time"

	"github.com/kvgate/kvgate/ingest"
)

// Source is a direct event source a route replica can fall back to while the plane is
// down: an *ingest.Manager over the endpoints whose engine events it can reach.
type Source interface {
	Start(ctx context.Context)
	Close() error
	Status(i int) ingest.EndpointStatus
	UsesFastKeys(i int) bool
}

// Fallback lets a route replica follow engines directly while the plane is down. Leave
// TensorRT-LLM endpoints out of Covers: their drain is destructive, so a fallback drain
// would take events from the ingest replica (and so from every other route replica).
type Fallback struct {
	// New builds a fresh source each time the plane goes down (a Manager starts once).
	New func() (Source, error)
	// Covers[i] says whether the source follows the endpoint at inventory index i.
	Covers []bool
	// After is how long the plane must be down before falling back (default 2s: a
	// nats-server restart or a leader change is usually shorter, and then nothing moves).
	After time.Duration
}

// SetFallback arms the fallback; call it before Start.
func (r *Route) SetFallback(f *Fallback) {
	if f != nil && f.After <= 0 {
		f.After = 2 * time.Second
	}
	r.fb = f
}

func (r *Route) covered(i int) bool {
	return r.fb != nil && i >= 0 && i < len(r.fb.Covers) && r.fb.Covers[i]
}

// fallbackSource is the running fallback, or nil.
func (r *Route) fallbackSource() Source {
	if p := r.fbActive.Load(); p != nil {
		return *p
	}
	return nil
}

// stepFallback starts the fallback once the plane has been down for Fallback.After, and
// stops it when the plane is back: the ingest replica's fresh snapshot then replaces what
// the fallback wrote. Called by the watch goroutine only.
func (r *Route) stepFallback(ctx context.Context, now time.Time) {
	if r.fb == nil {
		return
	}
	log := r.cfg.Logger
	if r.up.Load() {
		r.downSince = time.Time{}
		if src := r.fallbackSource(); src != nil {
			// Closed before it is cleared: a snapshot applied once it is cleared replaces
			// everything the fallback wrote, and no fallback write can follow it.
			src.Close()
			r.fbActive.Store(nil)
			r.KeysChanged()
			log.Info("plane: back: direct subscription stopped; resyncing from the plane")
			for _, e := range r.all {
				if r.covered(e.Index) {
					e.setState(stSyncing, whyReconnect)
					e.lastReq.Store(0)
					e.requestSnapshot()
				}
			}
		}
		return
	}
	if r.downSince.IsZero() {
		r.downSince = now
	}
	if r.fallbackSource() != nil || now.Sub(r.downSince) < r.fb.After {
		return
	}
	src, err := r.fb.New()
	if err != nil {
		if !r.fbFailed {
			log.Warn("plane: down, and the direct fallback cannot start", "err", err)
		}
		r.fbFailed = true
		return
	}
	r.fbFailed = false
	src.Start(ctx)
	r.fbActive.Store(&src)
	r.KeysChanged()
	log.Warn("plane: down: following the engines directly until it returns", "down_for", now.Sub(r.downSince).Round(time.Millisecond))
	for _, e := range r.all {
		if r.covered(e.Index) {
			e.setState(stDegraded, whyFallback)
		}
	}
}

// stopFallback closes a running fallback (Route.Close).
func (r *Route) stopFallback() {
	if src := r.fallbackSource(); src != nil {
		r.fbActive.Store(nil)
		r.KeysChanged()
		src.Close()
	}
}
