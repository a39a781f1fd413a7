package zmtp

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvgate/kvgate/internal/testfix"
	"github.com/kvgate/kvgate/internal/zmqlog"
)

// streamPeer is a PUB that writes a pre-encoded block of messages in a loop as fast as
// TCP takes it: the reader under test is the only thing working per message.
func streamPeer(b *testing.B, msg []byte) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	block := bytes.Repeat(msg, max(1, 64<<10/len(msg)))
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				go func() { // drain the subscriber's handshake and subscription
					buf := make([]byte, 512)
					for {
						if _, err := c.Read(buf); err != nil {
							return
						}
					}
				}()
				if _, err := c.Write(cat(greeting(3, 0, "NULL"), readyPUB)); err != nil {
					return
				}
				for {
					if _, err := c.Write(block); err != nil {
						return
					}
				}
			}()
		}
	}()
	return "tcp://" + ln.Addr().String()
}

// BenchmarkSubRecv: messages per second one subscriber connection reads, ours against
// go-zeromq's SUB (a reader goroutine per connection, a channel per socket), on the
// same stream of vLLM-sized [topic, seq, payload] messages.
func BenchmarkSubRecv(b *testing.B) {
	for _, size := range []int{400, 4000} {
		msg := vllmMessage(size)
		b.Run("zmtp/"+itoa(size), func(b *testing.B) {
			addr := streamPeer(b, msg)
			s, err := Dial(context.Background(), addr, Options{Subscribe: []string{""}, Timeout: time.Second})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			b.SetBytes(int64(len(msg)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if f, err := s.Recv(); err != nil || len(f) != 3 {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
		b.Run("zmq4/"+itoa(size), func(b *testing.B) {
			addr := streamPeer(b, msg)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s := zmq4.NewSub(ctx, zmq4.WithLogger(zmqlog.Discard))
			defer s.Close()
			s.SetOption(zmq4.OptionSubscribe, "")
			if err := s.Dial(addr); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(msg)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if m, err := s.Recv(); err != nil || len(m.Frames) != 3 {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

func itoa(n int) string {
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// BenchmarkSubParked: one message at a time on an idle connection, as the fleet's
// engines publish (a batch, then nothing for ~30 ms): the peer writes the next message
// only once the subscriber has handed the last one off, so every message finds the
// reader parked. Recv (a buffered reader: the EAGAIN read, then the data read) against
// Serve (the data read only). proc-cpu-ns/op is the whole process's CPU, peer included.
func BenchmarkSubParked(b *testing.B) {
	msg := vllmMessage(400)
	for _, mode := range []string{"recv", "serve"} {
		b.Run(mode, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			next := make(chan struct{}, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				go io.Copy(io.Discard, c) //nolint:errcheck // the handshake and subscription
				if _, err := c.Write(cat(greeting(3, 0, "NULL"), readyPUB)); err != nil {
					return
				}
				for range next {
					if _, err := c.Write(msg); err != nil {
						return
					}
				}
			}()
			s, err := Dial(context.Background(), "tcp://"+ln.Addr().String(), Options{Subscribe: []string{""}, Timeout: time.Second})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			n := 0
			handle := func(f [][]byte) {
				if len(f) != 3 {
					b.Error("bad message")
				}
				if n++; n >= b.N {
					go s.Close() // not from handle: Close waits for it
					return
				}
				next <- struct{}{}
			}
			b.ResetTimer()
			cpu0, rd0 := testfix.ProcessCPU(), readSyscalls()
			next <- struct{}{}
			if mode == "recv" {
				for n < b.N {
					f, err := s.Recv()
					if err != nil {
						b.Fatal(err)
					}
					handle(f)
				}
			} else {
				s.Serve(handle) //nolint:errcheck // ends with the Close
			}
			b.ReportMetric(float64(testfix.ProcessCPU()-cpu0)/float64(b.N), "proc-cpu-ns/op")
			if rd0 >= 0 {
				b.ReportMetric(float64(readSyscalls()-rd0)/float64(b.N), "read-syscalls/op")
			}
			close(next)
			s.Close()
		})
	}
}

// readSyscalls is the process's read syscalls so far (syscr in /proc/self/io), -1 where
// it cannot be read.
func readSyscalls() int64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "syscr: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return -1
}
