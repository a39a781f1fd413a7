package zmtp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// recvAll is what a loop of Recv yields from a stream: each message's frames joined
// with "|" and the error it ended with.
func recvAll(s *Sub, max int) (msgs []string, err error) {
	for i := 0; i < max; i++ {
		f, err := s.Recv()
		if err != nil {
			return msgs, err
		}
		msgs = append(msgs, string(bytes.Join(f, []byte("|"))))
	}
	return msgs, nil
}

// serveAll is the same through Serve.
func serveAll(s *Sub) (msgs []string, err error) {
	err = s.Serve(func(f [][]byte) { msgs = append(msgs, string(bytes.Join(f, []byte("|")))) })
	return msgs, err
}

// sameEnd reports whether two ways of reading a stream ended alike: a clean end, a
// truncation, or the same protocol error.
func sameEnd(a, b error) bool {
	switch {
	case a == nil || b == nil:
		return a == b
	case errors.Is(a, io.EOF) || errors.Is(b, io.EOF):
		return errors.Is(a, io.EOF) == errors.Is(b, io.EOF)
	case errors.Is(a, io.ErrUnexpectedEOF) || errors.Is(b, io.ErrUnexpectedEOF):
		return errors.Is(a, io.ErrUnexpectedEOF) == errors.Is(b, io.ErrUnexpectedEOF)
	}
	return a.Error() == b.Error()
}

// FuzzServe: Serve yields the messages a loop of Recv yields from the same peer bytes,
// and ends the same way, however the stream is cut into reads.
func FuzzServe(f *testing.F) {
	ok := cat(greeting(3, 1, "NULL"), readyPUB)
	f.Add(cat(ok, vllmMessage(10), vllmMessage(300)), byte(0))
	f.Add(cat(ok, vllmMessage(10), vllmMessage(300)), byte(1))
	f.Add(cat(ok, []byte("\x04\x0b\x04PING\x00\x64ctx1\x00\x03two")), byte(2))
	f.Add(cat(ok, []byte("\x01\x02kv\x04\x05\x04PONG")), byte(1))
	f.Add(cat(ok, []byte("\x04\x0a\x05ERROR\x03bye")), byte(0))
	f.Add(cat(ok, []byte("\x03\xff\xff\xff\xff\xff\xff\xff\xff")), byte(0))
	f.Add(cat(ok, []byte("\x02\x00\x00\x00\x00\x00\x00\x00\x05abc")), byte(1))
	const limit = 1 << 12
	f.Fuzz(func(t *testing.T, data []byte, cut byte) {
		opt := Options{Subscribe: []string{"kv"}, MaxMessage: limit, ReadBuffer: 16}
		a, err := Handshake(context.Background(), rw{bytes.NewReader(data)}, opt)
		if err != nil {
			return
		}
		want, wantErr := recvAll(a, len(data)+1)
		var r io.Reader = bytes.NewReader(data)
		switch cut % 3 {
		case 1:
			r = iotest.OneByteReader(r)
		case 2:
			r = iotest.HalfReader(r)
		}
		b, err := Handshake(context.Background(), rw{r}, opt)
		if err != nil {
			t.Fatalf("second handshake failed: %v", err)
		}
		got, gotErr := serveAll(b)
		if strings.Join(got, "\n") != strings.Join(want, "\n") || len(got) != len(want) {
			t.Fatalf("Serve gave %q, Recv %q", got, want)
		}
		if !sameEnd(gotErr, wantErr) {
			t.Fatalf("Serve ended with %v, Recv with %v", gotErr, wantErr)
		}
	})
}

// TestServeSocket: over TCP, messages cut anywhere across writes arrive whole and in
// order, a PING between them gets its PONG, and Close ends Serve. A lost readiness
// (the parked reader not woken for the second half of a message) would hang it.
func TestServeSocket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	msg := cat(vllmMessage(300), []byte("\x04\x0b\x04PING\x00\x64ctx1"), vllmMessage(5000))
	const rounds = 40
	pong := make(chan []byte, 1)
	end := make(chan struct{})
	defer close(end)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		go func() { // what the subscriber writes, until it closes
			var got []byte
			buf := make([]byte, 256)
			for {
				n, err := c.Read(buf)
				got = append(got, buf[:n]...)
				if err != nil {
					pong <- got
					return
				}
			}
		}()
		c.Write(cat(greeting(3, 1, "NULL"), readyPUB)) //nolint:errcheck
		for i := 0; i < rounds; i++ {
			at := 1 + i*len(msg)/rounds  // a cut that moves through the message
			c.Write(msg[:at])            //nolint:errcheck
			time.Sleep(time.Millisecond) // let the reader drain and park
			c.Write(msg[at:])            //nolint:errcheck
		}
		<-end // hold the connection: the subscriber closes it
	}()
	s, err := Dial(context.Background(), "tcp://"+ln.Addr().String(), Options{Subscribe: []string{""}, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	all := make(chan struct{})
	go func() { <-all; s.Close() }() // not from handle: Close waits for it
	done := make(chan error, 1)
	go func() {
		done <- s.Serve(func(f [][]byte) {
			want := 300
			if n%2 == 1 {
				want = 5000
			}
			if len(f) != 3 || string(f[0]) != "kv-events" || len(f[2]) != want {
				t.Errorf("message %d: %d frames", n, len(f))
			}
			if n++; n == 2*rounds {
				close(all)
			}
		})
	}()
	if err := <-done; err == nil || errors.Is(err, ErrProtocol) {
		t.Fatalf("Serve after Close: %v", err)
	}
	if n != 2*rounds {
		t.Fatalf("%d messages, want %d", n, 2*rounds)
	}
	if got := <-pong; !bytes.Contains(got, []byte("\x04\x09\x04PONGctx1")) {
		t.Fatalf("peer received % x, want a PONG", got)
	}
}

// TestServeAllocatesNothing: once its buffer has grown, Serve allocates nothing per
// message: a stream 100 times longer costs no more allocations.
func TestServeAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	for _, size := range []int{200, 5000, 100000} {
		run := func(msgs int) float64 {
			return testing.AllocsPerRun(3, func() {
				l := &loopStream{head: cat(greeting(3, 1, "NULL"), readyPUB), msg: vllmMessage(size), ping: []byte("\x04\x0b\x04PING\x00\x00ctx1")}
				s, err := Handshake(context.Background(), rw{io.LimitReader(l, int64(msgs*(len(l.msg)+1)))}, Options{Subscribe: []string{"kv"}})
				if err != nil {
					t.Fatal(err)
				}
				s.Serve(func(f [][]byte) {}) //nolint:errcheck // the stream ends inside a message
			})
		}
		short, long := run(100), run(10000)
		if long > short {
			t.Errorf("%d-octet payloads: %.0f allocs for 10,000 messages, %.0f for 100: want no more", size, long, short)
		}
	}
}
