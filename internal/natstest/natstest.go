// Package natstest runs a real nats-server with JetStream for tests: 127.0.0.1, a free
// port, a temporary store directory, and kill / restart on the same port and store.
// A missing nats-server fails the test (it is never skipped): `make fetch` installs it.
package natstest

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Server is one nats-server -js process (or none, between Kill and Start).
type Server struct {
	t    testing.TB
	bin  string
	port int
	dir  string
	URL  string // nats://127.0.0.1:port

	mu  sync.Mutex
	cmd *exec.Cmd
	out *bytes.Buffer
}

// Start starts a server and stops it when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		t.Fatalf("nats-server is not installed: `make fetch` installs it (Debian package nats-server): %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := &Server{t: t, bin: bin, port: port, dir: t.TempDir(), URL: "nats://127.0.0.1:" + strconv.Itoa(port)}
	s.Start()
	t.Cleanup(s.Kill)
	return s
}

// Start (re)starts the server on its port and store and waits until it listens.
func (s *Server) Start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return
	}
	var out bytes.Buffer
	cmd := exec.Command(s.bin, "-js", "-a", "127.0.0.1", "-p", strconv.Itoa(s.port), "-sd", s.dir)
	cmd.Stdout, cmd.Stderr = &out, &out
	deadline := time.Now().Add(15 * time.Second)
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start nats-server: %v", err)
	}
	s.cmd, s.out = cmd, &out
	for {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(s.port), 200*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("nats-server did not listen on %d: %s", s.port, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Wipe deletes the server's store (call between Kill and Start): a server that comes
// back with no streams, as after losing its disk.
func (s *Server) Wipe() {
	s.t.Helper()
	if err := os.RemoveAll(s.dir); err != nil {
		s.t.Fatal(err)
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		s.t.Fatal(err)
	}
}

// Kill stops the server at once (SIGKILL), as a crash would.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	s.cmd.Wait()
	s.cmd = nil
}
