package zmtp

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvgate/kvgate/internal/zmqlog"

	"github.com/kvgate/kvgate/internal/testfix"
)

func freeTCP(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return "tcp://" + ln.Addr().String()
}

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Logf("python: %s", strings.TrimSpace(string(p)))
	return len(p), nil
}

// startPython runs a script from testdata/zmtp under Debian's python3 (python3-zmq,
// python3-msgpack); the test fails, never skips, without them.
func startPython(t *testing.T, script string, args ...string) (io.WriteCloser, *bufio.Scanner) {
	t.Helper()
	if out, err := exec.Command("/usr/bin/python3", "-c", "import zmq, msgpack").CombinedOutput(); err != nil {
		t.Fatalf("needs /usr/bin/python3 with python3-zmq and python3-msgpack (run `make fetch`): %v\n%s", err, out)
	}
	return startPythonArgs(t, append([]string{filepath.Join("..", "..", "testdata", "zmtp", script)}, args...)...)
}

// startPythonArgs runs /usr/bin/python3 with args, killed with the test, its stderr in the
// test's log.
func startPythonArgs(t *testing.T, args ...string) (io.WriteCloser, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command("/usr/bin/python3", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	testfix.ReapOnCleanup(t, cmd, in)
	return in, bufio.NewScanner(out)
}

// recvTimeout is Recv with a deadline on the connection.
func recvTimeout(t *testing.T, s *Sub, d time.Duration) ([][]byte, error) {
	t.Helper()
	s.conn.SetReadDeadline(time.Now().Add(d))
	return s.Recv()
}

// TestLibzmqPubInterop: libzmq's PUB (python3-zmq from Debian) publishes vLLM-shaped
// messages of short and long frames, interleaved with a topic we did not subscribe to,
// after a silence in which libzmq heartbeats us: every message arrives in order with the
// payloads the publisher hashed, none of the other topic, and the PINGs were answered
// (libzmq drops a connection whose PINGs get no traffic back within its timeout, and
// the PUB would then drop every message).
func TestLibzmqPubInterop(t *testing.T) {
	const n = 300
	addr := freeTCP(t)
	in, out := startPython(t, "libzmq_pub.py", addr, fmt.Sprint(n), "20", "600")
	if !out.Scan() || out.Text() != "ready" {
		t.Fatalf("publisher: %q", out.Text())
	}
	ctx := context.Background()
	var s *Sub
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; {
		s, err = Dial(ctx, addr, Options{Subscribe: []string{"kv-events"}, Timeout: time.Second})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if ma, mi := s.Version(); ma != 3 || mi != 1 || s.PeerSocketType() != "PUB" {
		t.Fatalf("libzmq greeted as ZMTP %d.%d, %q: this test means to exercise the 3.1 SUBSCRIBE command", ma, mi, s.PeerSocketType())
	}
	// The first probe proves the subscription reached libzmq.
	f, err := recvTimeout(t, s, 5*time.Second)
	if err != nil || len(f) != 3 || string(f[2]) != "probe" {
		t.Fatalf("first message %q, %v", f, err)
	}
	io.WriteString(in, "go\n")
	h := sha256.New()
	next := uint64(0)
	long := 0
	for {
		f, err := recvTimeout(t, s, 10*time.Second)
		if err != nil {
			t.Fatalf("after %d messages: %v", next, err)
		}
		if len(f) != 3 || string(f[0]) != "kv-events" || len(f[1]) != 8 {
			t.Fatalf("message %d: %d frames, topic %q", next, len(f), f[0])
		}
		seq := binary.BigEndian.Uint64(f[1])
		if seq == 1<<64-1 {
			if string(f[2]) == "probe" {
				continue // sent before "go" arrived
			}
			break
		}
		if seq != next {
			t.Fatalf("seq %d, want %d", seq, next)
		}
		if len(f[2]) > 255 {
			long++
		}
		h.Write(f[2])
		next++
	}
	if !out.Scan() {
		t.Fatal("publisher exited")
	}
	want := fmt.Sprintf("sent %d %s", n, hex.EncodeToString(h.Sum(nil)))
	if out.Text() != want {
		t.Fatalf("publisher says %q, we received %q", out.Text(), want)
	}
	if long == 0 || long == n {
		t.Fatalf("%d of %d payloads in long frames: both sizes must be exercised", long, n)
	}
}

// TestZmq4PubInterop: go-zeromq's PUB speaks ZMTP 3.0, so the subscription goes as the
// 3.0 message form; it must filter and deliver as libzmq does.
func TestZmq4PubInterop(t *testing.T) {
	pub := zmq4.NewPub(context.Background(), zmq4.WithLogger(zmqlog.Discard))
	defer pub.Close()
	addr := freeTCP(t)
	if err := pub.Listen(addr); err != nil {
		t.Fatal(err)
	}
	s, err := Dial(context.Background(), addr, Options{Subscribe: []string{"kv"}, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if ma, mi := s.Version(); ma != 3 || mi != 0 {
		t.Fatalf("zmq4 greeted as ZMTP %d.%d; this test means to exercise the 3.0 subscription message", ma, mi)
	}
	topics := pub.(zmq4.Topics)
	for deadline := time.Now().Add(5 * time.Second); len(topics.Topics()) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("zmq4 PUB never saw the subscription")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := topics.Topics(); len(got) != 1 || got[0] != "kv" {
		t.Fatalf("zmq4 PUB topics %q", got)
	}
	big := make([]byte, 70000)
	for i := range big {
		big[i] = byte(i * 31)
	}
	for i := 0; i < 50; i++ {
		var seq [8]byte
		binary.BigEndian.PutUint64(seq[:], uint64(i))
		if err := pub.Send(zmq4.NewMsgFrom([]byte("nope"), seq[:], []byte("x"))); err != nil {
			t.Fatal(err)
		}
		if err := pub.Send(zmq4.NewMsgFrom([]byte("kv"), seq[:], big[:i*1400])); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 50; i++ {
		f, err := recvTimeout(t, s, 5*time.Second)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if len(f) != 3 || string(f[0]) != "kv" || binary.BigEndian.Uint64(f[1]) != uint64(i) || string(f[2]) != string(big[:i*1400]) {
			t.Fatalf("message %d: %d frames, topic %q, %d octets", i, len(f), f[0], len(f[len(f)-1]))
		}
	}
}
