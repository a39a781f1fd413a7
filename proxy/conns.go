package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/cloudwego/hertz/pkg/network"
	"github.com/cloudwego/hertz/pkg/protocol"
	"github.com/puzpuzpuz/xsync/v3"
)

// The hertz client cannot abandon a request while it waits for response headers, so
// a client that leaves during a long non-streamed generation would leave the engine
// working. kvgate's dialer wraps each upstream connection; when a request's header
// goes out on one, the connection is recorded under (endpoint, exchange tag), and a
// client disconnect closes exactly that connection, which the engine sees as a cancel.

// connectDialer marks dial failures (a connect failure retries elsewhere, unlike a
// timeout or a broken exchange after the engine accepted the request) and wraps
// connections so they can be found by request.
type connectDialer struct {
	network.Dialer
	reg *connRegistry
}

type dialError struct{ err error }

func (e *dialError) Error() string { return "connect: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

func (d connectDialer) DialConnection(n, address string, timeout time.Duration, tlsConfig *tls.Config) (network.Conn, error) {
	c, err := d.Dialer.DialConnection(n, address, timeout, tlsConfig)
	if err != nil {
		return nil, &dialError{err}
	}
	return &trackedConn{Conn: c, addr: address, reg: d.reg}, nil
}

type trackedConn struct {
	network.Conn
	addr string
	reg  *connRegistry
	idle time.Duration // read timeout hertz asked for, applied per read (0: none)
	// A request header held back so that it leaves in one write with its body (see
	// WriteBinary), and the pooled buffer that joined them until it is flushed.
	hdr    []byte
	held   bool
	joined *[]byte
}

// SetReadTimeout makes the timeout an idle timeout: the standard transport would set
// one absolute deadline, cutting off any stream longer than -upstream-timeout; kvgate
// means "between reads" (netpoll's meaning), so every read below renews it.
func (c *trackedConn) SetReadTimeout(t time.Duration) error {
	c.idle = t
	return c.Conn.SetReadTimeout(t)
}

func (c *trackedConn) renew() {
	if c.idle > 0 {
		c.Conn.SetReadDeadline(time.Now().Add(c.idle)) //nolint:errcheck
	}
}

func (c *trackedConn) Read(b []byte) (int, error) { c.renew(); return c.Conn.Read(b) }

func (c *trackedConn) Peek(n int) ([]byte, error) {
	if c.Conn.Len() < n {
		c.renew()
	}
	return c.Conn.Peek(n)
}

func (c *trackedConn) Skip(n int) error {
	if c.Conn.Len() < n {
		c.renew()
	}
	return c.Conn.Skip(n)
}

func (c *trackedConn) ReadBinary(n int) ([]byte, error) {
	if c.Conn.Len() < n {
		c.renew()
	}
	return c.Conn.ReadBinary(n)
}

func (c *trackedConn) ReadByte() (byte, error) {
	if c.Conn.Len() < 1 {
		c.renew()
	}
	return c.Conn.ReadByte()
}

// hdrConnTag is a per-exchange tag kvgate adds to upstream requests: client-supplied
// X-Request-Id values need not be unique, so they cannot name a connection.
const hdrConnTag = "X-Kvgate-Exchange"

var connTagLine = []byte("\r\n" + hdrConnTag + ": ")

// Header and body in one write: hertz's standard transport writes the request header
// into its buffer and a body of 4 KiB or more as a buffer node of its own, and its Flush
// issues one write(2) per node. A chat request is mostly such a body, so each upstream
// request cost two writes, and at the engine often two reads and wakeups, where nginx
// sends one. trackedConn holds the header back and, when a large body follows, hands
// hertz one pooled buffer holding both (a copy of the body, far cheaper than the
// syscall); any other write or a Flush first releases a held header, so the bytes on the
// wire and their order are hertz's.
const (
	joinMinBody = 4 << 10  // hertz's own threshold: smaller bodies share the header's node
	joinMax     = 64 << 10 // larger requests keep two writes (no large pooled buffers)
)

var joinPool = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// WriteBinary sees the request header (hertz writes it in one call), records the
// connection under its exchange tag and holds the header back for its body. A held
// header's next write is its body, which is not searched: a body may hold any bytes, a
// tag line among them. Where a body is searched (a streamed body's later chunks, any
// write after a header too large to hold), a forged line names no exchange: the tag
// carries the registry's secret (parseTag).
func (c *trackedConn) WriteBinary(b []byte) (int, error) {
	if !c.held {
		if id, ok := c.reg.tagIn(b); ok {
			if !c.reg.set(c.addr, id, c) {
				c.Conn.Close() //nolint:errcheck // the client left before the request went out
				return 0, errExchangeCancelled
			}
			if len(b) < joinMax {
				c.hdr, c.held = append(c.hdr[:0], b...), true
				return len(b), nil
			}
		}
	}
	if c.held {
		c.held = false
		if len(b) >= joinMinBody && len(c.hdr)+len(b) <= joinMax && c.joined == nil {
			buf := joinPool.Get().(*[]byte)
			*buf = append(append((*buf)[:0], c.hdr...), b...)
			c.joined = buf
			if _, err := c.Conn.WriteBinary(*buf); err != nil {
				return 0, err
			}
			return len(b), nil
		}
		if _, err := c.Conn.WriteBinary(c.hdr); err != nil {
			return 0, err
		}
	}
	return c.Conn.WriteBinary(b)
}

// release passes a held header on to hertz's buffer.
func (c *trackedConn) release() error {
	if !c.held {
		return nil
	}
	c.held = false
	_, err := c.Conn.WriteBinary(c.hdr)
	return err
}

func (c *trackedConn) Malloc(n int) ([]byte, error) {
	if err := c.release(); err != nil {
		return nil, err
	}
	return c.Conn.Malloc(n)
}

func (c *trackedConn) Write(b []byte) (int, error) {
	if err := c.release(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// Flush sends what hertz buffered; a joined buffer goes back to the pool once written
// (hertz keeps no use of a node it flushed). After a failed write the connection is
// dropped and so is the buffer: hertz may still hold it.
func (c *trackedConn) Flush() error {
	if err := c.release(); err != nil {
		return err
	}
	err := c.Conn.Flush()
	if c.joined != nil {
		if err == nil {
			joinPool.Put(c.joined)
		}
		c.joined = nil
	}
	return err
}

// ToHertzError keeps hertz's error normalization (it recognizes stale pooled
// connections by it).
func (c *trackedConn) ToHertzError(err error) error {
	if n, ok := c.Conn.(network.ErrorNormalization); ok {
		return n.ToHertzError(err)
	}
	return err
}

var connTagKey = []byte(hdrConnTag)

// connRegistry maps an in-flight exchange (upstream address and tag) to the connection
// carrying it. Every upstream request writes it once and reads it twice, from every
// request goroutine at once, so it is an xsync.MapOf (the card's concurrent map): its
// buckets lock independently where one mutex over a map would serialize all requests.
type connRegistry struct {
	m *xsync.MapOf[exchangeKey, *trackedConn]
	// secret ends every tag this registry's exchanges send ("<number>.<secret>"), so
	// that only do's tags register a connection: a tag line in a request body (a client
	// can send any bytes through the pass-through) would otherwise register the
	// connection under a number of the client's choosing, an entry nothing takes again
	// (a leak) or another exchange's (its cancel would close this connection).
	secret [tagSecretBytes]byte
}

// tagSecretBytes: '.' and 16 hex digits (64 random bits).
const tagSecretBytes = 1 + 16

// exchangeKey names an exchange: the upstream address and the tag's number. A struct
// of the address kvgate already holds and the number, not a joined string: the key is
// built three times per request and a string would be an allocation each time.
type exchangeKey struct {
	addr string
	id   uint64
}

func newConnRegistry() *connRegistry {
	r := &connRegistry{m: xsync.NewMapOf[exchangeKey, *trackedConn]()}
	r.secret[0] = '.'
	const hex = "0123456789abcdef"
	for i, x := 1, rand.Uint64(); i < len(r.secret); i, x = i+1, x>>4 {
		r.secret[i] = hex[x&15]
	}
	return r
}

// appendTag appends the tag of exchange id to dst.
func (r *connRegistry) appendTag(dst []byte, id uint64) []byte {
	return append(strconv.AppendUint(dst, id, 10), r.secret[:]...)
}

// parseTag reads back the exchange number of a tag appendTag wrote; ok is false for
// anything else (no exchange of this registry's). strconv allocates only for the error,
// which the registry's own tags never take.
func (r *connRegistry) parseTag(b []byte) (id uint64, ok bool) {
	n := len(b) - len(r.secret)
	if n <= 0 || string(b[n:]) != string(r.secret[:]) {
		return 0, false
	}
	id, err := strconv.ParseUint(string(b[:n]), 10, 64)
	return id, err == nil
}

// tagIn finds the exchange tag header in b, a request header as hertz writes it.
func (r *connRegistry) tagIn(b []byte) (id uint64, ok bool) {
	i := bytes.Index(b, connTagLine)
	if i < 0 {
		return 0, false
	}
	tag := b[i+len(connTagLine):]
	j := bytes.IndexByte(tag, '\r')
	if j < 0 {
		return 0, false
	}
	return r.parseTag(tag[:j])
}

// cancelledExchange marks an exchange whose client left before its request header went
// out (netpoll senses it that early: the send had started, the header not yet written):
// set finds the mark and the request is never sent.
var cancelledExchange = &trackedConn{}

var errExchangeCancelled = errors.New("client left before the request was sent")

// set records c as carrying the exchange; false if the exchange was cancelled already.
func (r *connRegistry) set(addr string, id uint64, c *trackedConn) bool {
	key := exchangeKey{addr, id}
	prev, loaded := r.m.LoadOrStore(key, c)
	if loaded && prev != cancelledExchange {
		r.m.Store(key, c) // (tags are unique per exchange; tests reuse one)
	}
	return !loaded || prev != cancelledExchange
}

// cancel closes the exchange's connection, or marks the exchange so that it never starts.
func (r *connRegistry) cancel(key exchangeKey) {
	if c, loaded := r.m.LoadOrStore(key, cancelledExchange); loaded && c != cancelledExchange {
		c.Close() //nolint:errcheck
	}
}

func (r *connRegistry) take(key exchangeKey) *trackedConn {
	c, _ := r.m.LoadAndDelete(key)
	return c
}

// exchange is do's per-request state, pooled: the cancel callback is bound once, and
// done replaces a channel per request (both were allocations on every request).
type exchange struct {
	reg      *connRegistry
	key      exchangeKey
	tag      [20 + tagSecretBytes]byte // the number's decimal digits, then the secret
	done     sync.WaitGroup            // held while the cancel callback may run
	onCancel func()
}

var exchangePool = sync.Pool{New: func() any {
	ex := &exchange{}
	ex.onCancel = func() {
		defer ex.done.Done()
		ex.reg.cancel(ex.key)
	}
	return ex
}}

// do runs one upstream exchange until its response headers; if ctx ends first (the
// client left), the request's connection is closed so the engine stops.
func (s *Server) do(ctx context.Context, host string, req *protocol.Request, res *protocol.Response) error {
	ex := exchangePool.Get().(*exchange)
	ex.reg, ex.key = s.conns, exchangeKey{host, s.exchanges.Add(1)}
	req.Header.SetCanonical(connTagKey, s.conns.appendTag(ex.tag[:0], ex.key.id)) // copies; the name is canonical
	ex.done.Add(1)
	stop := context.AfterFunc(ctx, ex.onCancel)
	err := s.client.Do(ctx, req, res)
	if stop() {
		ex.done.Done() // the callback will never run
	} else {
		ex.done.Wait() // its mark must not outlive the cleanup below
	}
	s.conns.take(ex.key)
	ex.reg = nil
	exchangePool.Put(ex)
	return err
}
