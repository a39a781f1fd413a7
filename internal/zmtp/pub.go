package zmtp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// Pub is a minimal PUB for load generation (the fleet simulator's engines): it accepts
// SUB and XSUB peers, keeps each one's subscriptions (3.1 commands and 3.0 messages
// alike), and Send writes a message straight to every matching peer's socket from the
// caller's goroutine: no queue and no writer goroutine per socket. It never drops: a
// peer that does not read slows Send down (and is dropped after sendTimeout), where a
// ZeroMQ PUB would drop past its high-water mark. Not for engines' real traffic.
type Pub struct {
	ln   net.Listener
	addr string

	mu    sync.Mutex
	peers []*pubPeer
	out   []byte // Send's encoded message (mu held)
	wg    sync.WaitGroup
	done  chan struct{}
}

type pubPeer struct {
	conn net.Conn
	w    io.Writer  // conn's messages go through it (socketSink)
	wmu  sync.Mutex // serializes writes: Send and PONGs
	// until is the write deadline Send last set (wmu held). Send moves it only once less
	// than half of sendTimeout is left: setting a deadline re-arms a runtime timer, which
	// at a load generator's 31k writes a second was a cost of its own.
	until time.Time
	subs  []string // Pub.mu held
}

// sendTimeout bounds one write to one peer (Send: between half of it and all of it).
const sendTimeout = 5 * time.Second

// Listen binds a PUB on addr ("tcp://host:port"; port 0 picks a free one).
func Listen(addr string) (*Pub, error) {
	hostport, ok := strings.CutPrefix(addr, "tcp://")
	if !ok {
		return nil, fmt.Errorf("zmtp: %q: only tcp://host:port is supported", addr)
	}
	ln, err := net.Listen("tcp", hostport)
	if err != nil {
		return nil, err
	}
	p := &Pub{ln: ln, addr: "tcp://" + ln.Addr().String(), done: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the bound address, with the real port.
func (p *Pub) Addr() string { return p.addr }

func (p *Pub) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve runs one peer: the handshake, then its subscriptions and PINGs until it goes.
func (p *Pub) serve(c net.Conn) {
	defer p.wg.Done()
	defer c.Close()
	peer := &pubPeer{conn: c, w: socketSink(c)}
	r := frameReader{rd: bufio.NewReaderSize(c, 4096)}
	c.SetDeadline(time.Now().Add(sendTimeout)) //nolint:errcheck
	var out []byte
	var err error
	peer.wmu.Lock()
	_, _, _, out, err = r.greet(c, out, "PUB", "SUB", "XSUB")
	peer.wmu.Unlock()
	if err != nil {
		return
	}
	c.SetDeadline(time.Time{}) //nolint:errcheck
	p.mu.Lock()
	select {
	case <-p.done:
		p.mu.Unlock()
		return
	default:
	}
	p.peers = append(p.peers, peer)
	p.mu.Unlock()
	defer p.drop(peer)
	var body []byte
	for {
		flags, size, err := r.readHeader()
		if err != nil || size > maxCommand {
			return
		}
		if flags&flagCommand != 0 {
			if r.readCommand(size) != nil {
				return
			}
			name, data, err := parseCommand(r.cmd)
			if err != nil {
				return
			}
			switch string(name) {
			case "SUBSCRIBE":
				p.subscribe(peer, data, true)
			case "CANCEL":
				p.subscribe(peer, data, false)
			case "PING":
				if len(data) >= 2 && len(data) <= 18 {
					peer.wmu.Lock()
					out = appendCommand(out[:0], "PONG", data[2:])
					peer.until = time.Now().Add(sendTimeout)
					c.SetWriteDeadline(peer.until) //nolint:errcheck
					_, err = c.Write(out)
					peer.wmu.Unlock()
					if err != nil {
						return
					}
				}
			case "ERROR":
				return
			}
			continue
		}
		// A message from a SUB: 23/ZMTP's subscription form is one frame, 1 or 0 then
		// the topic. Anything else a SUB sends is not ours to act on.
		if body, err = r.readBody(body[:0], int(size)); err != nil {
			return
		}
		if flags&flagMore == 0 && len(body) > 0 && body[0] <= 1 {
			p.subscribe(peer, body[1:], body[0] == 1)
		}
	}
}

func (p *Pub) subscribe(peer *pubPeer, topic []byte, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		peer.subs = append(peer.subs, string(topic))
		return
	}
	for i, t := range peer.subs {
		if t == string(topic) {
			peer.subs = append(peer.subs[:i], peer.subs[i+1:]...)
			return
		}
	}
}

func (p *Pub) drop(peer *pubPeer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, q := range p.peers {
		if q == peer {
			p.peers = append(p.peers[:i], p.peers[i+1:]...)
			break
		}
	}
	peer.conn.Close()
}

// Subscribed reports how many peers hold at least one subscription.
func (p *Pub) Subscribed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, q := range p.peers {
		if len(q.subs) > 0 {
			n++
		}
	}
	return n
}

// WaitSubscribed blocks until a peer has subscribed (a PUB sends nothing to a peer
// before its subscription arrives: ZeroMQ's "slow joiner").
func (p *Pub) WaitSubscribed(ctx context.Context) error {
	for p.Subscribed() == 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}

func matches(subs []string, topic []byte) bool {
	for _, s := range subs {
		if len(topic) >= len(s) && string(topic[:len(s)]) == s {
			return true
		}
	}
	return false
}

// Send writes one message of frames to every peer subscribed to a prefix of its first
// frame. A peer whose write fails is dropped; Send reports an error only once closed.
func (p *Pub) Send(frames ...[]byte) error {
	if len(frames) == 0 {
		return errors.New("zmtp: Send needs at least one frame")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		return errors.New("zmtp: Send on a closed Pub")
	default:
	}
	p.out = p.out[:0]
	for i, f := range frames {
		var more byte
		if i < len(frames)-1 {
			more = flagMore
		}
		p.out = appendFrameHeader(p.out, more, len(f))
		p.out = append(p.out, f...)
	}
	for _, q := range p.peers {
		if !matches(q.subs, frames[0]) {
			continue
		}
		q.wmu.Lock()
		if now := time.Now(); q.until.Sub(now) < sendTimeout/2 {
			q.until = now.Add(sendTimeout)
			q.conn.SetWriteDeadline(q.until) //nolint:errcheck
		}
		_, err := q.w.Write(p.out)
		q.wmu.Unlock()
		if err != nil {
			q.conn.Close() // its serve goroutine drops it
		}
	}
	return nil
}

// Close stops listening, closes every peer and waits for their goroutines.
func (p *Pub) Close() error {
	p.mu.Lock()
	select {
	case <-p.done:
		p.mu.Unlock()
		return nil
	default:
	}
	close(p.done)
	err := p.ln.Close()
	for _, q := range p.peers {
		q.conn.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}
