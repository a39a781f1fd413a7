package ingest

import (
	"context"
	"encoding/binary"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/go-zeromq/zmq4"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/internal/zmqlog"
)

// TestWrongSocketTypeWarnsOnce: the events address is a ROUTER (a replay port put in the
// events field): every dial fails the handshake, counted as a protocol error, with one
// WARN naming the socket type however many redials; once a PUB takes the port, the
// endpoint subscribes and applies.
func TestWrongSocketTypeWarnsOnce(t *testing.T) {
	addr := freeAddr(t, 1)
	router := zmq4.NewRouter(context.Background(), zmq4.WithLogger(zmqlog.Discard))
	if err := router.Listen(addr); err != nil {
		t.Fatal(err)
	}
	inv := newInv(t)
	cfg := testConfig(inv)
	log := &recordingHandler{}
	cfg.Logger = slog.New(log)
	m := startManager(t, cfg, EndpointConfig{Name: "e", Engine: "vllm", Events: addr})
	waitFor(t, "three refused handshakes", func() bool { return m.Status(0).ProtocolErrors >= 3 })
	router.Close()
	if w := log.warns("does not speak ZMTP 3.x PUB"); len(w) != 1 || !strings.Contains(w[0], "ROUTER") {
		t.Fatalf("want one WARN naming the ROUTER, got %q", w)
	}
	if s := m.Status(0); s.Connected || s.DialFailures < 3 || !strings.Contains(s.LastProtocolError, "ROUTER") {
		t.Fatalf("status %+v", s)
	}
	var pub *enginepub.Publisher
	waitFor(t, "a PUB on the port", func() bool {
		p, err := enginepub.New(enginepub.Config{Endpoint: addr})
		pub = p
		return err == nil
	})
	t.Cleanup(func() { pub.Close() })
	waitSubscribed(t, pub)
	pub.Publish(stored(7, 8))
	waitFor(t, "keys applied", func() bool { return len(invKeys(inv, 0)) == 2 })
}

// scriptedEngine accepts connections on addr and plays scripts[i] to the i-th (the
// last one to any later connection), holding each connection open until the test ends.
func scriptedEngine(t *testing.T, scripts ...[]byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	go func() {
		for i := 0; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			c.Write(scripts[min(i, len(scripts)-1)])
			go func() { // drain what the subscriber sends
				buf := make([]byte, 512)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	return "tcp://" + ln.Addr().String()
}

// zmtpPUBHandshake is a ZMTP 3.1 PUB's greeting and READY, written from 37/ZMTP's grammar.
var zmtpPUBHandshake = append(append([]byte{0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 1}, append([]byte("NULL"), make([]byte, 16+1+31)...)...),
	[]byte("\x04\x19\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB")...)

// zmtpEventMessage frames [topic, seq, payload] (short topic and seq, long payload).
func zmtpEventMessage(topic string, seq uint64, payload []byte) []byte {
	b := append([]byte{1, byte(len(topic))}, topic...)
	b = append(b, 1, 8)
	b = binary.BigEndian.AppendUint64(b, seq)
	b = append(b, 2)
	b = binary.BigEndian.AppendUint64(b, uint64(len(payload)))
	return append(b, payload...)
}

// TestMalformedStreamReconnects: an engine whose stream breaks the protocol mid-way (a
// frame with reserved flag bits, then on the next connection a frame announcing 1 TiB)
// loses that connection, with a WARN and a protocol error each; what it applied before
// stays, and the next good connection carries on.
func TestMalformedStreamReconnects(t *testing.T) {
	f := enginepub.Format{Flavor: enginepub.VLLM}
	batch := func(keys ...uint64) []byte { return f.AppendBatch(nil, 0, []enginepub.Event{stored(keys...)}) }
	hs := zmtpPUBHandshake
	addr := scriptedEngine(t,
		slices.Concat(hs, zmtpEventMessage("kv", 0, batch(1, 2)), []byte{0x10, 1, 'x'}),
		slices.Concat(hs, zmtpEventMessage("kv", 1, batch(3)), []byte{0x02, 0, 0, 1, 0, 0, 0, 0, 0}),
		slices.Concat(hs, zmtpEventMessage("kv", 2, batch(4))),
	)
	inv := newInv(t)
	cfg := testConfig(inv)
	log := &recordingHandler{}
	cfg.Logger = slog.New(log)
	m := startManager(t, cfg, EndpointConfig{Name: "e", Engine: "vllm", Events: addr, Topic: "kv"})
	waitFor(t, "the third connection's batch", func() bool { return m.Status(0).LastSeq == 2 })
	s := m.Status(0)
	if got := invKeys(inv, 0); !slices.Equal(got, []uint64{1, 2, 3, 4}) {
		t.Fatalf("inventory %v", got)
	}
	if s.ProtocolErrors != 2 || s.Reconnects != 2 || s.GapsCleared+s.Restarts != 0 || !s.Connected ||
		!strings.Contains(s.LastProtocolError, "size limit") {
		t.Fatalf("status %+v", s)
	}
	w := log.warns("broke the ZMTP protocol")
	if len(w) != 2 || !strings.Contains(w[0], "reserved flag bits") || !strings.Contains(w[1], "size limit") {
		t.Fatalf("WARNs %q", w)
	}
}
