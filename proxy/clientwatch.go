package proxy

import (
	"context"
	"sync"
	"time"

	"github.com/cloudwego/hertz/pkg/app"
	"github.com/cloudwego/hertz/pkg/network"
)

// The public listener runs on netpoll's transport unless it serves TLS, which
// netpoll lacks: hertz then uses its standard transport (one goroutine per client
// connection, on Go's netpoller). netpoll senses a client that leaves while its request
// is in flight (its poller sees the hang-up, and the request's context ends); the
// standard transport notices only when it next reads or writes, which for a
// non-streamed generation is after the engine has done all the work. clientWatch gives
// the TLS listener the same cancel: once a request has been in flight for watchAfter,
// a goroutine blocks in a one-byte Peek on the client's connection (hertz reads nothing
// else from it until the handler returns: the body is read whole), and an EOF or error
// cancels the request's context, which closes the upstream connection (conns.go) or
// ends the stream (forward.go). Requests that finish sooner cost a timer reset and stop
// and no goroutine. (Session 6 measured the plain listener on the standard transport
// too: fewer syscalls, but no less CPU per request; see bench/RESULTS.md.)

// watchAfter is how long a request runs before its client is watched: a client that
// leaves is noticed this much later at most (a small share of any generation's time),
// and shorter requests never start a watcher (with 2 ms, the overhead bench's loaded
// requests on a busy machine started them and cost more CPU per request).
const watchAfter = 50 * time.Millisecond

const (
	watchIdle     uint8 = iota
	watchArmed          // timer running
	watchWatching       // the watcher blocks in Peek
	watchStopping       // stop woke the watcher and waits for it
)

// clientWatch lives in the pooled reqState; its timer is made once. A timer callback
// that stop could not cancel may run after the state was reused: it finds the watch
// idle (and returns) or armed for a later request (and starts that watch early, which
// is harmless: that request's body is read too).
type clientWatch struct {
	mu     sync.Mutex
	state  uint8
	conn   network.Conn
	cancel context.CancelFunc
	timer  *time.Timer
	done   chan struct{} // the watcher's exit after stop woke it
}

// arm starts watching conn for the request whose context cancel ends. The request's
// body must already be read: from here until stop, the watcher may read conn.
func (w *clientWatch) arm(conn network.Conn, cancel context.CancelFunc) {
	w.mu.Lock()
	w.conn, w.cancel, w.state = conn, cancel, watchArmed
	w.mu.Unlock()
	if w.timer == nil {
		w.done = make(chan struct{}, 1)
		w.timer = time.AfterFunc(watchAfter, w.run)
		return
	}
	w.timer.Reset(watchAfter)
}

// run is the watcher (the timer's goroutine).
func (w *clientWatch) run() {
	w.mu.Lock()
	if w.state != watchArmed {
		w.mu.Unlock()
		return
	}
	w.state = watchWatching
	conn := w.conn
	w.mu.Unlock()
	_, err := conn.Peek(1)
	w.mu.Lock()
	stopping := w.state == watchStopping
	cancel := w.cancel
	w.state = watchIdle
	w.mu.Unlock()
	if stopping {
		w.done <- struct{}{}
		return
	}
	if err != nil {
		cancel() // the client left (EOF, reset): the request's work is cancelled
	}
	// Data: the client sent its next request already (pipelining); hertz reads it
	// from the buffer Peek filled, and this request is not watched any further.
}

// stop ends the watch, and the request's context, before the handler returns (hertz reads conn next). A watcher
// blocked in Peek is woken by a read deadline in the past; the deadline is cleared
// after it (hertz sets its own before reading the next request).
func (w *clientWatch) stop() {
	if w.cancel == nil {
		return // not armed (the plain listener)
	}
	w.timer.Stop()
	w.mu.Lock()
	watching := w.state == watchWatching
	conn := w.conn
	if watching {
		w.state = watchStopping
	} else {
		w.state = watchIdle
	}
	cancel := w.cancel
	w.conn, w.cancel = nil, nil
	w.mu.Unlock()
	if watching {
		conn.SetReadDeadline(time.Unix(1, 0)) //nolint:errcheck // a closed conn wakes it too
		<-w.done
		conn.SetReadDeadline(time.Time{}) //nolint:errcheck
	}
	cancel()
}

// watchClient is how a handler starts its watch once the body is read (on the TLS
// listener; netpoll's context already ends when the client leaves): the returned
// context ends when the client leaves; st.watch.stop must run before the handler
// returns.
func (s *Server) watchClient(ctx context.Context, c *app.RequestContext, st *reqState) context.Context {
	if !s.watchClients {
		return ctx
	}
	ctx, cancel := context.WithCancel(ctx)
	st.watch.arm(c.GetConn(), cancel)
	return ctx
}
