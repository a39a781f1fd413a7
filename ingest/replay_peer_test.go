package ingest

import (
	"encoding/binary"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginepub"
)

// replayPeer accepts every connection on a replay address, writes script to it (nothing:
// a peer that accepts TCP and never greets) and holds it open until the client closes it
// or the test ends. open is how many connections the client has not closed yet.
type replayPeer struct {
	addr     string
	accepted atomic.Int32
	live     atomic.Int32
}

func startReplayPeer(t *testing.T, script []byte) *replayPeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &replayPeer{addr: "tcp://" + ln.Addr().String()}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			p.accepted.Add(1)
			p.live.Add(1)
			c.Write(script)
			go func() {
				defer p.live.Add(-1)
				buf := make([]byte, 512)
				for {
					if _, err := c.Read(buf); err != nil {
						return // the client closed it (or the test ended)
					}
				}
			}()
		}
	}()
	return p
}

// TestReplayStalledHandshakeLeaksNothing: the engine's replay address accepts TCP and
// never greets (a hung engine, or another service on the port). Each replay (the
// subscribe-time one and one per gap in the live seqs) must give up within the dial
// timeout and close its connection: before, zmq4's handshake had no deadline, so each
// abandoned dial left a goroutine blocked on the socket and the socket open, for as
// long as the peer kept it (here: until the test ends), one more per gap.
func TestReplayStalledHandshakeLeaksNothing(t *testing.T) {
	peer := startReplayPeer(t, nil)
	base, _ := liveGoroutines() // the peer's accept loop included
	inv := newInv(t)
	addr := freeAddr(t, 1)
	pub := newPub(t, enginepub.Config{Endpoint: addr})
	cfg := testConfig(inv)
	cfg.DialTimeout, cfg.ReplayTimeout = 100*time.Millisecond, time.Second
	m, err := NewManager(cfg, []EndpointConfig{{Name: "e", Engine: "vllm", Events: addr, Replay: peer.addr}})
	if err != nil {
		t.Fatal(err)
	}
	m.Start(t.Context())
	waitSubscribed(t, pub)
	pub.Publish(stored(1))
	waitFor(t, "first batch", func() bool { return m.Status(0).LastSeq == 0 })
	for i := uint64(1); i <= 3; i++ {
		pub.SetSeq(pub.Seq() + 2) // one batch lost: a gap to fill from the replay buffer
		pub.Publish(stored(1 + i))
	}
	waitFor(t, "the gapped batches", func() bool { return m.Status(0).LastSeq == 6 })
	// The peer's accept loop may take a connection the kernel completed after the replay
	// already gave up on it: wait for it rather than read the count at once.
	waitFor(t, "one replay connection at subscribe time and one per gap", func() bool { return peer.accepted.Load() >= 4 })
	m.Close()
	pub.Close()
	deadline := time.Now().Add(5 * time.Second)
	for peer.live.Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := peer.live.Load(); n != 0 {
		t.Errorf("%d of %d replay connections still open after Close", n, peer.accepted.Load())
	}
	settleGoroutines(t, base)
}

// routerHandshake is a ZMTP 3.1 ROUTER's greeting and READY, from 37/ZMTP's grammar.
var routerHandshake = append(append([]byte{0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 1}, append([]byte("NULL"), make([]byte, 16+1+31)...)...),
	[]byte("\x04\x1c\x05READY\x0bSocket-Type\x00\x00\x00\x06ROUTER")...)

// TestReplayHugeFrameIsRefused: the replay peer greets as a ROUTER and then announces a
// frame of 2^62 octets. The replay must end with a protocol error and the live stream
// carry on: before, zmq4 allocated the announced size at once, and the runtime's
// "makeslice: len out of range" panic in its reader goroutine killed the process (a
// size just under the heap's reach, an out-of-memory crash).
func TestReplayHugeFrameIsRefused(t *testing.T) {
	huge := binary.BigEndian.AppendUint64([]byte{0x02}, 1<<62)
	peer := startReplayPeer(t, slices.Concat(routerHandshake, huge))
	inv := newInv(t)
	addr := freeAddr(t, 1)
	pub := newPub(t, enginepub.Config{Endpoint: addr})
	m := startManager(t, testConfig(inv), EndpointConfig{Name: "e", Engine: "vllm", Events: addr, Replay: peer.addr})
	waitSubscribed(t, pub)
	waitFor(t, "the subscribe-time replay", func() bool { return peer.accepted.Load() >= 1 })
	pub.Publish(stored(7, 8))
	waitFor(t, "keys applied", func() bool { return len(invKeys(inv, 0)) == 2 })
	if s := m.Status(0); s.ReplayedBatches != 0 || !s.Connected {
		t.Fatalf("status %+v", s)
	}
}

// TestPeerClosingAfterHandshakeDoesNotSpin: an event socket that completes the ZMTP
// handshake and closes every connection at once (a crash-looping engine's PUB, or a
// peer doing it on purpose) is redialed once per retry interval, as one that breaks the
// protocol is: before, a connection that ended cleanly was redialed at once, so the
// subscriber spun dial, handshake and two log lines as fast as loopback allowed.
func TestPeerClosingAfterHandshakeDoesNotSpin(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Write(zmtpPUBHandshake)
			// Read the subscriber's greeting, READY and SUBSCRIBE (64+27+12 octets), so
			// its handshake completes, then close.
			io.ReadFull(c, make([]byte, 64+27+12))
			c.Close()
		}
	}()
	inv := newInv(t)
	cfg := testConfig(inv) // RetryInterval 20ms
	m := startManager(t, cfg, EndpointConfig{Name: "e", Engine: "vllm", Events: "tcp://" + ln.Addr().String()})
	waitFor(t, "a first connection", func() bool { return accepted.Load() >= 1 })
	time.Sleep(time.Second)
	// At one redial per 20ms: about 50 in that second; allow for a slow machine's
	// scheduling on the low side only.
	if n := accepted.Load(); n > 100 {
		t.Fatalf("%d connections in about a second (reconnects %d): the subscriber spins", n, m.Status(0).Reconnects)
	}
}
