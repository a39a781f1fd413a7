package zmtp

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

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
