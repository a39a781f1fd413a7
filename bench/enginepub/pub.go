package enginepub

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvgate/kvgate/internal/zmqlog"
	"github.com/kvgate/kvgate/internal/zmtp"
)

// Config describes one engine publisher (one data-parallel rank).
type Config struct {
	// Endpoint is the PUB address to listen on, e.g. tcp://127.0.0.1:0 (0 = any free port).
	Endpoint string
	// Replay is the optional ROUTER replay address; empty = no replay socket.
	Replay string
	Topic  string
	Format Format
	// ReplayBuffer bounds the batches kept for replay (vLLM's buffer_steps); default 10000.
	ReplayBuffer int
	// ReplayTopicFrame selects the newer reply layout ["", topic, seq, payload]; the older
	// one (and SGLang's) is ["", seq, payload].
	ReplayTopicFrame bool
	// Seq is the sequence number of the first batch (default 0).
	Seq uint64
	// Backlog batches are put in the replay buffer before the sockets listen, as if they
	// had been published while nobody was subscribed (e.g. during a subscriber's outage).
	Backlog [][]Event
	// Lightweight publishes through internal/zmtp's load-generation PUB instead of
	// zmq4's: each Publish writes to the subscribers' sockets from the caller's goroutine
	// (no queue, no writer goroutine per socket) and never drops. For load generation
	// (the fleet simulator's 1,024 engines); no replay socket.
	Lightweight bool
}

type replayEntry struct {
	seq     uint64
	payload []byte
}

// Publisher is a PUB socket (plus optional ROUTER replay) speaking an engine's framing.
type Publisher struct {
	cfg    Config
	pub    zmq4.Socket
	lite   *zmtp.Pub // instead of pub (Config.Lightweight)
	router zmq4.Socket
	addr   string
	raddr  string

	mu       sync.Mutex
	seq      uint64
	buf      []byte
	seqb     [8]byte       // a lightweight Publish's seq frame (mu held)
	ring     []replayEntry // bounded replay buffer, oldest first
	isClosed bool

	wg sync.WaitGroup
}

// New listens on cfg.Endpoint (and cfg.Replay) and returns the publisher.
func New(cfg Config) (*Publisher, error) {
	if cfg.ReplayBuffer <= 0 {
		cfg.ReplayBuffer = 10000
	}
	p := &Publisher{cfg: cfg, seq: cfg.Seq}
	for _, evs := range cfg.Backlog {
		payload := cfg.Format.AppendBatch(nil, 0, evs)
		p.ring = append(p.ring, replayEntry{seq: p.seq, payload: payload})
		p.seq++
	}
	if cfg.Lightweight {
		if cfg.Replay != "" {
			return nil, errors.New("enginepub: a lightweight publisher has no replay socket")
		}
		lite, err := zmtp.Listen(cfg.Endpoint)
		if err != nil {
			return nil, err
		}
		p.lite, p.addr = lite, lite.Addr()
		return p, nil
	}
	p.pub = zmq4.NewPub(context.Background(), zmq4.WithLogger(zmqlog.Discard))
	if err := p.pub.Listen(cfg.Endpoint); err != nil {
		p.pub.Close()
		return nil, err
	}
	p.addr = boundAddr(cfg.Endpoint, p.pub.Addr())
	if cfg.Replay != "" {
		p.router = zmq4.NewRouter(context.Background(), zmq4.WithLogger(zmqlog.Discard))
		if err := p.router.Listen(cfg.Replay); err != nil {
			p.router.Close()
			p.pub.Close()
			return nil, err
		}
		p.raddr = boundAddr(cfg.Replay, p.router.Addr())
		p.wg.Add(1)
		go p.serveReplay()
	}
	return p, nil
}

func boundAddr(ep string, a net.Addr) string {
	if a == nil {
		return ep
	}
	if i := strings.Index(ep, "://"); i >= 0 {
		return ep[:i+3] + a.String()
	}
	return "tcp://" + a.String()
}

// Addr is the PUB address actually bound (with the real port).
func (p *Publisher) Addr() string { return p.addr }

// ReplayAddr is the ROUTER address actually bound, or "".
func (p *Publisher) ReplayAddr() string { return p.raddr }

// SetSeq sets the sequence number of the next batch: 0 simulates an engine restart, a
// jump forward simulates lost batches.
func (p *Publisher) SetSeq(seq uint64) {
	p.mu.Lock()
	p.seq = seq
	p.mu.Unlock()
}

// Seq is the sequence number the next batch will carry.
func (p *Publisher) Seq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

// ResetReplay forgets the replay buffer (a restarted engine has none).
func (p *Publisher) ResetReplay() {
	p.mu.Lock()
	p.ring = p.ring[:0]
	p.mu.Unlock()
}

// Publish encodes events as one batch and sends it with the next sequence number.
func (p *Publisher) Publish(events ...Event) error {
	_, err := p.PublishTimed(events...)
	return err
}

// PublishTimed is Publish, and reports how long after stamping the batch's ts the
// write returned: the part of the event lag (ts to applied) spent in the publisher,
// which a preempted load generator inflates. A lightweight publisher (no replay buffer
// to keep the payload for) encodes into its reused buffer and writes it under its
// lock: no copy per batch.
func (p *Publisher) PublishTimed(events ...Event) (time.Duration, error) {
	p.mu.Lock()
	if p.lite != nil && p.router == nil {
		now := time.Now()
		p.buf = p.cfg.Format.AppendBatch(p.buf[:0], unixSeconds(now), events)
		seq := p.seq
		p.seq++
		binary.BigEndian.PutUint64(p.seqb[:], seq)
		err := p.lite.Send([]byte(p.cfg.Topic), p.seqb[:], p.buf)
		p.mu.Unlock()
		return time.Since(now), err
	}
	now := time.Now()
	p.buf = p.cfg.Format.AppendBatch(p.buf[:0], unixSeconds(now), events)
	payload := append([]byte(nil), p.buf...)
	p.mu.Unlock()
	err := p.PublishRaw(payload)
	return time.Since(now), err
}

// Drop encodes events as the next batch and keeps it for replay without sending it:
// a batch lost on the wire (a PUB drops messages past its high-water mark).
func (p *Publisher) Drop(events ...Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	payload := p.cfg.Format.AppendBatch(nil, wallSeconds(), events)
	p.keepLocked(p.seq, payload)
	p.seq++
}

// wallSeconds is a batch's ts as the engines stamp it: Unix time in seconds (Python's
// time.time()), which kvgate's event-lag histogram reads against its own clock.
func wallSeconds() float64 { return unixSeconds(time.Now()) }

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

func (p *Publisher) keepLocked(seq uint64, payload []byte) {
	if p.router == nil {
		return
	}
	if len(p.ring) >= p.cfg.ReplayBuffer {
		copy(p.ring, p.ring[1:])
		p.ring = p.ring[:len(p.ring)-1]
	}
	p.ring = append(p.ring, replayEntry{seq: seq, payload: payload})
}

// PublishRaw sends an already-encoded payload with the next sequence number. The
// publisher keeps payload for replay: the caller must not modify it afterwards.
func (p *Publisher) PublishRaw(payload []byte) error {
	p.mu.Lock()
	seq := p.seq
	p.seq++
	p.keepLocked(seq, payload)
	p.mu.Unlock()
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	if p.lite != nil {
		return p.lite.Send([]byte(p.cfg.Topic), s[:], payload)
	}
	return p.pub.SendMulti(zmq4.NewMsgFrom([]byte(p.cfg.Topic), s[:], payload))
}

// WaitSubscribed blocks until at least one subscriber has sent its subscription (ZeroMQ
// PUB drops messages sent before that: the "slow joiner").
func (p *Publisher) WaitSubscribed(ctx context.Context) error {
	if p.lite != nil {
		return p.lite.WaitSubscribed(ctx)
	}
	t, ok := p.pub.(zmq4.Topics)
	if !ok {
		return errors.New("enginepub: PUB socket does not report topics")
	}
	for {
		if len(t.Topics()) > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

var endMarker = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

func (p *Publisher) serveReplay() {
	defer p.wg.Done()
	for {
		msg, err := p.router.Recv()
		if err != nil {
			if errors.Is(err, context.Canceled) {
				return
			}
			// A peer went away: keep serving the others unless the socket is closed.
			time.Sleep(time.Millisecond)
			if p.closed() {
				return
			}
			continue
		}
		if len(msg.Frames) < 2 {
			continue
		}
		id := msg.Frames[0]
		last := msg.Frames[len(msg.Frames)-1]
		if len(last) != 8 {
			continue
		}
		start := binary.BigEndian.Uint64(last)
		p.mu.Lock()
		var todo []replayEntry
		for _, e := range p.ring {
			if e.seq >= start {
				todo = append(todo, e)
			}
		}
		p.mu.Unlock()
		for _, e := range todo {
			var s [8]byte
			binary.BigEndian.PutUint64(s[:], e.seq)
			if err := p.router.SendMulti(p.reply(id, s[:], e.payload)); err != nil {
				break
			}
		}
		_ = p.router.SendMulti(p.reply(id, endMarker, nil))
	}
}

func (p *Publisher) reply(id, seq, payload []byte) zmq4.Msg {
	if p.cfg.ReplayTopicFrame {
		topic := []byte(p.cfg.Topic)
		if payload == nil {
			topic = nil
		}
		return zmq4.NewMsgFrom(id, nil, topic, seq, payload)
	}
	return zmq4.NewMsgFrom(id, nil, seq, payload)
}

func (p *Publisher) closed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.isClosed
}

// Close stops the sockets and waits for the replay server.
func (p *Publisher) Close() error {
	p.mu.Lock()
	p.isClosed = true
	p.mu.Unlock()
	if p.lite != nil {
		return p.lite.Close()
	}
	err := p.pub.Close()
	if p.router != nil {
		if e := p.router.Close(); e != nil && err == nil {
			err = e
		}
		p.wg.Wait()
	}
	if err != nil {
		return fmt.Errorf("enginepub: close: %w", err)
	}
	return nil
}
