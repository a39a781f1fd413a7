package zmtp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// Wire bytes written out by hand from 37/ZMTP's grammar and 23/ZMTP's worked example,
// not produced by this package's encoders: the scripted peers below speak them.

// greeting is a peer's 64-octet greeting.
func greeting(major, minor byte, mech string) []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xFF, 0x7F, major, minor
	copy(g[12:], mech)
	return g
}

// readyPUB is READY with Socket-Type "PUB": flags 0x04, size 25, "\x05READY",
// "\x0bSocket-Type", value size 3 (4 octets), "PUB".
var readyPUB = []byte("\x04\x19\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB")

// readyType is READY with another Socket-Type (short, unpadded).
func readyType(typ string) []byte {
	body := "\x05READY\x0bSocket-Type\x00\x00\x00" + string(rune(len(typ))) + typ
	return append([]byte{0x04, byte(len(body))}, body...)
}

// scriptedPeer accepts one connection, writes script, records what the subscriber
// sends until it closes (or hold ends), then closes.
type scriptedPeer struct {
	addr string
	mu   sync.Mutex
	got  bytes.Buffer
	done chan struct{}
}

func startPeer(t *testing.T, script []byte, hold time.Duration) *scriptedPeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &scriptedPeer{addr: "tcp://" + ln.Addr().String(), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		defer ln.Close()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write(script)
		c.SetReadDeadline(time.Now().Add(hold))
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			p.mu.Lock()
			p.got.Write(buf[:n])
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return p
}

func (p *scriptedPeer) received() []byte {
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]byte(nil), p.got.Bytes()...)
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// TestHandshakeWire: what the subscriber sends, byte for byte, to a 3.1 and a 3.0 peer.
func TestHandshakeWire(t *testing.T) {
	ourGreeting := greeting(3, 1, "NULL")
	readySUB := []byte("\x04\x19\x05READY\x0bSocket-Type\x00\x00\x00\x03SUB")
	for _, c := range []struct {
		minor byte
		subs  []byte
	}{
		// 3.1: SUBSCRIBE commands, flags 0x04, "\x09SUBSCRIBE" + topic.
		{1, []byte("\x04\x0c\x09SUBSCRIBEkv\x04\x0a\x09SUBSCRIBE")},
		// 3.0: one-frame messages, flags 0x00, 0x01 + topic.
		{0, []byte("\x00\x03\x01kv\x00\x01\x01")},
	} {
		p := startPeer(t, cat(greeting(3, c.minor, "NULL"), readyPUB), 200*time.Millisecond)
		s, err := Dial(context.Background(), p.addr, Options{Subscribe: []string{"kv", ""}, Timeout: time.Second})
		if err != nil {
			t.Fatalf("3.%d: %v", c.minor, err)
		}
		s.Close()
		want := cat(ourGreeting, readySUB, c.subs)
		if got := p.received(); !bytes.Equal(got, want) {
			t.Errorf("3.%d peer received\n% x\nwant\n% x", c.minor, got, want)
		}
	}
}

// TestMalformedPeers: each bad peer gets a clear error, promptly, and no panic.
func TestMalformedPeers(t *testing.T) {
	ok := cat(greeting(3, 1, "NULL"), readyPUB)
	long := func(flags byte, n uint64) []byte {
		b := []byte{flags | flagLong, 0, 0, 0, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint64(b[1:], n)
		return b
	}
	for _, c := range []struct {
		name   string
		script []byte
		close  bool   // the peer closes after its script (else it holds the connection)
		dial   error  // Dial's error, or nil and then Recv's
		recv   error  // Recv's error
		text   string // the error must say this
	}{
		{name: "http server", script: []byte("HTTP/1.1 400 Bad Request\r\n\r\n"), dial: ErrGreeting, text: "not ZMTP"},
		{name: "zmtp 2.0", script: []byte("\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f\x01\x01"), dial: ErrVersion, text: "major version 1"},
		{name: "curve", script: greeting(3, 0, "CURVE"), dial: ErrMechanism, text: `"CURVE"`},
		{name: "router", script: cat(greeting(3, 1, "NULL"), readyType("ROUTER")), dial: ErrSocketType, text: `"ROUTER"`},
		{name: "no socket type", script: cat(greeting(3, 1, "NULL"), []byte("\x04\x06\x05READY")), dial: ErrSocketType, text: "no Socket-Type"},
		{name: "peer error", script: cat(greeting(3, 1, "NULL"), []byte("\x04\x0e\x05ERROR\x07go away")), dial: ErrPeer, text: "go away"},
		{name: "message before ready", script: cat(greeting(3, 1, "NULL"), []byte("\x00\x01x")), dial: ErrFrame, text: "want READY"},
		{name: "ready overrun", script: cat(greeting(3, 1, "NULL"), []byte("\x04\x11\x05READY\x0bSocket-Typ")), dial: ErrFrame, text: "overruns"},
		{name: "greeting truncated", script: greeting(3, 1, "NULL")[:40], close: true, dial: io.ErrUnexpectedEOF, text: "truncated"},
		{name: "oversize frame", script: cat(ok, long(0, 1<<40)), recv: ErrTooLarge, text: "limit"},
		{name: "oversize multipart", script: cat(ok, long(flagMore, 600<<10), make([]byte, 600<<10), long(0, 600<<10)), recv: ErrTooLarge, text: "limit"},
		{name: "size over 2^63", script: cat(ok, long(0, 1<<63)), recv: ErrFrame, text: "2^63"},
		{name: "oversize command", script: cat(ok, long(flagCommand, 1<<20)), recv: ErrTooLarge, text: "command"},
		{name: "truncated body", script: cat(ok, []byte("\x00\x64short")), close: true, recv: io.ErrUnexpectedEOF, text: "truncated"},
		{name: "truncated multipart", script: cat(ok, []byte("\x01\x02kv")), close: true, recv: io.ErrUnexpectedEOF, text: "truncated"},
		{name: "truncated long size", script: cat(ok, []byte("\x02\x00\x00")), close: true, recv: io.ErrUnexpectedEOF, text: "truncated"},
		{name: "reserved flags", script: cat(ok, []byte("\x10\x01x")), recv: ErrFrame, text: "reserved"},
		{name: "command in message", script: cat(ok, []byte("\x01\x02kv\x04\x07\x04PING\x00\x00")), recv: ErrFrame, text: "inside a multipart"},
		{name: "command with more", script: cat(ok, []byte("\x05\x07\x04PING\x00\x00")), recv: ErrFrame, text: "MORE"},
		{name: "empty command", script: cat(ok, []byte("\x04\x00")), recv: ErrFrame, text: "command name"},
		{name: "ping without ttl", script: cat(ok, []byte("\x04\x05\x04PING")), recv: ErrFrame, text: "TTL"},
		{name: "error later", script: cat(ok, []byte("\x04\x0a\x05ERROR\x03bye")), recv: ErrPeer, text: "bye"},
		{name: "clean close", script: ok, close: true, recv: io.EOF, text: "EOF"},
	} {
		t.Run(c.name, func(t *testing.T) {
			hold := 3 * time.Second
			if c.close {
				hold = 100 * time.Millisecond
			}
			p := startPeer(t, c.script, hold)
			opt := Options{Subscribe: []string{""}, Timeout: 2 * time.Second, MaxMessage: 1 << 20}
			start := time.Now()
			s, err := Dial(context.Background(), p.addr, opt)
			if c.dial != nil {
				if !errors.Is(err, c.dial) || !strings.Contains(err.Error(), c.text) {
					t.Fatalf("Dial: %v, want %v saying %q", err, c.dial, c.text)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				_, err = s.Recv()
				if !errors.Is(err, c.recv) || !strings.Contains(err.Error(), c.text) {
					t.Fatalf("Recv: %v, want %v saying %q", err, c.recv, c.text)
				}
			}
			if el := time.Since(start); el > time.Second {
				t.Fatalf("took %v: the error must not wait for a timeout", el)
			}
			if c.name == "router" {
				// 37/ZMTP: a peer rejecting the socket type SHOULD say so with ERROR.
				if got := p.received(); !bytes.Contains(got, []byte("\x05ERROR\x13invalid socket type")) {
					t.Fatalf("no ERROR command sent to the ROUTER: % x", got)
				}
			}
		})
	}
}

// TestSilentPeerTimesOut: a peer that accepts TCP and never greets fails Dial after
// Timeout, and a cancelled context ends the wait at once.
func TestSilentPeerTimesOut(t *testing.T) {
	p := startPeer(t, nil, 5*time.Second)
	start := time.Now()
	_, err := Dial(context.Background(), p.addr, Options{Timeout: 200 * time.Millisecond})
	if !errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Fatalf("Dial against a silent peer: %v after %v", err, time.Since(start))
	}
	p = startPeer(t, nil, 5*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start = time.Now()
	_, err = Dial(ctx, p.addr, Options{Timeout: 10 * time.Second})
	if !errors.Is(err, context.Canceled) || time.Since(start) > 2*time.Second {
		t.Fatalf("cancelled Dial: %v after %v", err, time.Since(start))
	}
}

// TestPingGetsPong: a PING (TTL, context) between messages gets a PONG with the same
// context, and the messages around it arrive whole; unknown commands are skipped.
func TestPingGetsPong(t *testing.T) {
	script := cat(greeting(3, 1, "NULL"), readyPUB,
		[]byte("\x01\x02kv\x00\x03one"),
		[]byte("\x04\x0b\x04PING\x00\x64ctx1"),
		[]byte("\x04\x05\x04PONG"),
		[]byte("\x04\x09\x07UNKNOWNx"),
		[]byte("\x00\x03two"))
	p := startPeer(t, script, 500*time.Millisecond)
	s, err := Dial(context.Background(), p.addr, Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	f, err := s.Recv()
	if err != nil || len(f) != 2 || string(f[0]) != "kv" || string(f[1]) != "one" {
		t.Fatalf("first: %q %v", f, err)
	}
	f, err = s.Recv()
	if err != nil || len(f) != 1 || string(f[0]) != "two" {
		t.Fatalf("second: %q %v", f, err)
	}
	s.Close()
	pong := []byte("\x04\x09\x04PONGctx1")
	if got := p.received(); !bytes.HasSuffix(got, pong) {
		t.Fatalf("peer received % x, want it to end with PONG % x", got, pong)
	}
}

// loopStream is a peer stream in memory: the greeting and READY, then msg repeated
// forever (a PING after every 16th); what the subscriber writes is discarded.
type loopStream struct {
	head []byte
	msg  []byte
	ping []byte
	n    int
	cur  []byte
}

func (l *loopStream) Read(p []byte) (int, error) {
	if len(l.cur) == 0 {
		switch {
		case l.head != nil:
			l.cur, l.head = l.head, nil
		case l.n%16 == 15:
			l.cur = l.ping
			l.n++
		default:
			l.cur = l.msg
			l.n++
		}
	}
	n := copy(p, l.cur)
	l.cur = l.cur[n:]
	return n, nil
}

func (l *loopStream) Write(p []byte) (int, error) { return len(p), nil }

// vllmMessage is a [topic, seq, payload] message of payload octets, as frames on the wire.
func vllmMessage(payload int) []byte {
	var b []byte
	b = append(b, flagMore, 9)
	b = append(b, "kv-events"...)
	b = append(b, flagMore, 8, 0, 0, 0, 0, 0, 0, 0, 7)
	if payload > 255 {
		b = append(b, flagLong, 0, 0, 0, 0)
		b = binary.BigEndian.AppendUint32(b, uint32(payload))
	} else {
		b = append(b, 0, byte(payload))
	}
	return append(b, make([]byte, payload)...)
}

// TestRecvAllocatesNothing: once its buffers have grown, Recv allocates nothing per
// message, PINGs answered on the way included.
func TestRecvAllocatesNothing(t *testing.T) {
	for _, size := range []int{200, 5000, 100000} {
		l := &loopStream{head: cat(greeting(3, 1, "NULL"), readyPUB), msg: vllmMessage(size), ping: []byte("\x04\x0b\x04PING\x00\x00ctx1")}
		s, err := Handshake(context.Background(), l, Options{Subscribe: []string{"kv"}})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 64; i++ { // grow the buffers
			if _, err := s.Recv(); err != nil {
				t.Fatal(err)
			}
		}
		allocs := testing.AllocsPerRun(1000, func() {
			f, err := s.Recv()
			if err != nil || len(f) != 3 || len(f[2]) != size {
				t.Fatalf("Recv: %d frames, %v", len(f), err)
			}
		})
		if allocs != 0 {
			t.Errorf("%d-octet payloads: %.2f allocs per message, want 0", size, allocs)
		}
	}
}
