package zmtp

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"
)

// subscribed accepts one subscriber on a loopback socket, greets it as a 3.0 PUB and
// waits for its subscription; the caller then writes messages on conn. The subscriber is
// dialled and returned.
func subscribed(t *testing.T) (conn net.Conn, s *Sub) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		c.Write(cat(greeting(3, 0, "NULL"), readyPUB)) //nolint:errcheck // the Dial below fails if this did
		accepted <- c
	}()
	s, err = Dial(context.Background(), "tcp://"+ln.Addr().String(), Options{Subscribe: []string{""}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	conn, ok := <-accepted
	if !ok {
		t.Fatal("no connection accepted")
	}
	t.Cleanup(func() { conn.Close() })
	// The subscriber's greeting, READY and 3.0 subscription (one frame: 0x01), read whole:
	// a message written before the subscription arrived would be one the peer was not
	// asked for.
	want := len(cat(greeting(3, 1, "NULL"), readyType("SUB"))) + 3
	if _, err := io.ReadFull(conn, make([]byte, want)); err != nil {
		t.Fatal(err)
	}
	return conn, s
}

// recvWithin is Recv, failing the test when it has not returned within d (a lost
// wakeup would park the reader for good).
func recvWithin(t *testing.T, s *Sub, d time.Duration) ([][]byte, error) {
	t.Helper()
	type result struct {
		f   [][]byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		f, err := s.Recv()
		done <- result{f, err}
	}()
	select {
	case r := <-done:
		return r.f, r.err
	case <-time.After(d):
		t.Fatalf("Recv did not return within %v", d)
		return nil, nil
	}
}

// TestRecvMessageThenClose: a peer that writes its last message and closes right away
// gets both seen: the message, then io.EOF. The close must not hide behind the message:
// with an edge-triggered poller the data and the FIN can come in one readiness, and a
// reader that parks after taking the data without reading again (a short read is not
// proof of an empty socket) waits forever for the close (session 7's reverted
// one-read subscriber, whose ingest missed publishers' closes). Both orders: the reader
// parked before the octets arrive, and the octets and the FIN already queued when it
// first reads.
func TestRecvMessageThenClose(t *testing.T) {
	msg := vllmMessage(300)
	for _, tc := range []struct {
		name   string
		parked bool
	}{{"parked", true}, {"queued", false}} {
		parked := tc.parked
		t.Run(tc.name, func(t *testing.T) {
			for round := 0; round < 20; round++ {
				conn, s := subscribed(t)
				write := func() {
					if _, err := conn.Write(msg); err != nil {
						t.Error(err)
					}
					conn.Close()
				}
				if parked {
					time.AfterFunc(5*time.Millisecond, write)
				} else {
					write()
					time.Sleep(5 * time.Millisecond) // both in the socket before the first read
				}
				f, err := recvWithin(t, s, 5*time.Second)
				if err != nil || len(f) != 3 || len(f[2]) != 300 {
					t.Fatalf("round %d: %d frames, %v; want the message", round, len(f), err)
				}
				if _, err := recvWithin(t, s, 5*time.Second); err != io.EOF {
					t.Fatalf("round %d: after the last message: %v, want io.EOF", round, err)
				}
				s.Close()
			}
		})
	}
}

// TestRecvCloseUnblocks: Close from another goroutine ends a Recv parked on an idle
// socket (ingest's subscriber is stopped that way), with an error that is not io.EOF.
func TestRecvCloseUnblocks(t *testing.T) {
	_, s := subscribed(t)
	time.AfterFunc(20*time.Millisecond, func() { s.Close() })
	if _, err := recvWithin(t, s, 5*time.Second); err == nil || err == io.EOF || !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Recv after Close: %v, want net.ErrClosed", err)
	}
}

// TestRecvSocketResetIsError: a peer that resets the connection (RST, not a close) ends
// Recv with an error, never io.EOF (which ingest treats as a clean close).
func TestRecvSocketResetIsError(t *testing.T) {
	conn, s := subscribed(t)
	conn.(*net.TCPConn).SetLinger(0) //nolint:errcheck // linger 0: Close sends RST
	conn.Write(vllmMessage(10))      //nolint:errcheck
	time.Sleep(5 * time.Millisecond)
	conn.Close()
	for {
		_, err := recvWithin(t, s, 5*time.Second)
		if err == nil {
			continue // the message, if it was read before the reset
		}
		if err == io.EOF {
			t.Fatal("a reset connection read as a clean close")
		}
		return
	}
}

// TestRecvSocketAllocatesNothing: over a real socket, with the reader parking between
// messages, Recv allocates nothing per message once its buffers have grown.
func TestRecvSocketAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's instrumentation allocates")
	}
	conn, s := subscribed(t)
	msg := vllmMessage(400)
	next := make(chan struct{})
	go func() {
		for range next {
			if _, err := conn.Write(msg); err != nil {
				return
			}
		}
	}()
	defer close(next)
	recv := func() {
		next <- struct{}{} // written after Recv parked, most times
		if f, err := s.Recv(); err != nil || len(f) != 3 {
			t.Fatalf("Recv: %d frames, %v", len(f), err)
		}
	}
	for i := 0; i < 16; i++ {
		recv()
	}
	runtime.GC()
	if allocs := testing.AllocsPerRun(500, recv); allocs != 0 {
		t.Fatalf("%.2f allocs per message over a socket, want 0", allocs)
	}
}

// socketPair is a connected loopback pair: the accepted end and the dialled one.
func socketPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	b, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if a, err = ln.Accept(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// TestSinkStalledPeerHitsDeadline: Pub's writer to a peer that stops reading parks once
// the socket is full and gives up at the write deadline (Pub drops such a peer), having
// written what fit; everything written arrives intact once the peer reads.
func TestSinkStalledPeerHitsDeadline(t *testing.T) {
	a, b := socketPair(t)
	w := socketSink(a)
	chunk := make([]byte, 64<<10)
	for i := range chunk {
		chunk[i] = byte(i * 13)
	}
	a.SetWriteDeadline(time.Now().Add(300 * time.Millisecond)) //nolint:errcheck
	start := time.Now()
	var sent int
	var err error
	for err == nil && time.Since(start) < 10*time.Second {
		var n int
		n, err = w.Write(chunk)
		sent += n
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("writing to a stalled peer: %v after %v, want the deadline", err, time.Since(start))
	}
	got := make([]byte, sent)
	if _, err := io.ReadFull(b, got); err != nil {
		t.Fatal(err)
	}
	for i, c := range got {
		if c != chunk[i%len(chunk)] {
			t.Fatalf("octet %d of %d: %d, want %d", i, sent, c, chunk[i%len(chunk)])
		}
	}
}

// TestSinkGonePeerIsError: writing to a peer that closed ends in an error (EPIPE or a
// reset), not a signal that kills the process.
func TestSinkGonePeerIsError(t *testing.T) {
	a, b := socketPair(t)
	w := socketSink(a)
	b.Close()
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		_, err = w.Write(make([]byte, 4096))
		time.Sleep(time.Millisecond)
	}
	if err == nil {
		t.Fatal("100 writes to a closed peer all succeeded")
	}
}

// TestPubSendAllocatesNothing: once its buffer has grown, Send writes a message to a
// subscribed peer without allocating.
func TestPubSendAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's instrumentation allocates")
	}
	p, err := Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s, err := Dial(context.Background(), p.Addr(), Options{Subscribe: []string{""}, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := p.WaitSubscribed(context.Background()); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			if _, err := s.Recv(); err != nil {
				return
			}
		}
	}()
	topic, seq, payload := []byte("kv"), make([]byte, 8), make([]byte, 400)
	for i := 0; i < 16; i++ {
		if err := p.Send(topic, seq, payload); err != nil {
			t.Fatal(err)
		}
	}
	if allocs := testing.AllocsPerRun(1000, func() {
		if err := p.Send(topic, seq, payload); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Fatalf("%.2f allocs per Send, want 0", allocs)
	}
}
