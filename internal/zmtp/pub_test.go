package zmtp

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvgate/kvgate/internal/zmqlog"
)

// pubPayload is message i's payload: 40 to ~100 kB (short and long frames).
func pubPayload(i int) []byte {
	b := make([]byte, []int{40, 255, 256, 3000, 100000}[i%5])
	for j := range b {
		b[j] = byte(i + j*7)
	}
	return b
}

// sendRun publishes n messages on "kv-events" (each after one on "other", which no one
// subscribed to) and the end marker, and returns the digest of the payloads.
func sendRun(t *testing.T, p *Pub, n int) string {
	t.Helper()
	h := sha256.New()
	var seq [8]byte
	for i := 0; i < n; i++ {
		binary.BigEndian.PutUint64(seq[:], uint64(i))
		pl := pubPayload(i)
		h.Write(pl)
		if err := p.Send([]byte("other"), seq[:], []byte("x")); err != nil {
			t.Fatal(err)
		}
		if err := p.Send([]byte("kv-events"), seq[:], pl); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Send([]byte("kv-events"), []byte{255, 255, 255, 255, 255, 255, 255, 255}, nil); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestPubToLibzmqSub: libzmq's SUB (python3-zmq from Debian, ZMTP 3.1: a SUBSCRIBE
// command) receives every message of our PUB, in order, with the payloads sent, and
// none of the topic it did not subscribe to.
func TestPubToLibzmqSub(t *testing.T) {
	p, err := Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	_, out := startPython(t, "libzmq_sub.py", p.Addr(), "kv-events")
	if !out.Scan() || out.Text() != "connected" {
		t.Fatalf("subscriber: %q", out.Text())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.WaitSubscribed(ctx); err != nil {
		t.Fatal("libzmq's subscription never arrived")
	}
	const n = 500
	sum := sendRun(t, p, n)
	if !out.Scan() {
		t.Fatal("subscriber exited")
	}
	if want := fmt.Sprintf("got %d %s 0", n, sum); out.Text() != want {
		t.Fatalf("libzmq SUB says %q, want %q", out.Text(), want)
	}
}

// TestPubToZmq4AndOurSub: zmq4's SUB (ZMTP 3.0: a subscription message) and our own
// Sub both receive the run.
func TestPubToZmq4AndOurSub(t *testing.T) {
	p, err := Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	zs := zmq4.NewSub(context.Background(), zmq4.WithLogger(zmqlog.Discard))
	defer zs.Close()
	if err := zs.SetOption(zmq4.OptionSubscribe, "kv"); err != nil {
		t.Fatal(err)
	}
	if err := zs.Dial(p.Addr()); err != nil {
		t.Fatal(err)
	}
	s, err := Dial(context.Background(), p.Addr(), Options{Subscribe: []string{"kv-events"}, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for deadline := time.Now().Add(5 * time.Second); p.Subscribed() < 2; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 2 subscriptions arrived", p.Subscribed())
		}
	}
	const n = 200
	done := make(chan string, 1)
	go func() {
		h := sha256.New()
		for i := 0; ; i++ {
			m, err := zs.Recv()
			if err != nil || len(m.Frames) != 3 {
				done <- fmt.Sprintf("zmq4 message %d: %v", i, err)
				return
			}
			if binary.BigEndian.Uint64(m.Frames[1]) == 1<<64-1 {
				done <- fmt.Sprintf("%d %s", i, hex.EncodeToString(h.Sum(nil)))
				return
			}
			h.Write(m.Frames[2])
		}
	}()
	sums := make(chan string, 1)
	go func() { sums <- sendRun(t, p, n) }() // both subscribers read while it sends
	h := sha256.New()
	sum := ""
	for i := 0; ; i++ {
		f, err := recvTimeout(t, s, 5*time.Second)
		if err != nil || len(f) != 3 || string(f[0]) != "kv-events" {
			t.Fatalf("our Sub, message %d: %q, %v", i, f, err)
		}
		if binary.BigEndian.Uint64(f[1]) == 1<<64-1 {
			sum = <-sums
			if got := hex.EncodeToString(h.Sum(nil)); i != n || got != sum {
				t.Fatalf("our Sub got %d messages, digest %s; sent %d, %s", i, got, n, sum)
			}
			break
		}
		h.Write(f[2])
	}
	if got, want := <-done, fmt.Sprintf("%d %s", n, sum); got != want {
		t.Fatalf("zmq4 SUB: %s, want %s", got, want)
	}
}
