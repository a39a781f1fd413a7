package ingest

import (
	"bufio"
	"encoding/json"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/kvgate/kvgate/internal/testfix"
)

// pyEngine drives testdata/ingest/pyzmq_engine.py: a KV-event publisher on libzmq.
type pyEngine struct {
	t   *testing.T
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startPyEngine(t *testing.T) *pyEngine {
	t.Helper()
	check := exec.Command("/usr/bin/python3", "-c", "import zmq, msgpack")
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("the interop test needs /usr/bin/python3 with python3-zmq and python3-msgpack (run `make fetch`): %v\n%s", err, out)
	}
	cmd := exec.Command("/usr/bin/python3", filepath.Join("..", "testdata", "ingest", "pyzmq_engine.py"))
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = &testWriter{t}
	// If the test binary dies (a timeout panic skips Cleanup), take the engine with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &pyEngine{t: t, cmd: cmd, in: in, out: bufio.NewScanner(out)}
	testfix.ReapOnCleanup(t, cmd, in)
	return p
}

type testWriter struct{ t *testing.T }

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Logf("pyzmq_engine: %s", strings.TrimSpace(string(p)))
	return len(p), nil
}

func (p *pyEngine) send(cmd map[string]any) {
	p.t.Helper()
	b, _ := json.Marshal(cmd)
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		p.t.Fatal(err)
	}
}

func (p *pyEngine) do(cmd map[string]any) {
	p.t.Helper()
	p.send(cmd)
	if !p.out.Scan() {
		p.t.Fatalf("pyzmq_engine exited during %v", cmd)
	}
	if l := p.out.Text(); l != "ok" {
		p.t.Fatalf("pyzmq_engine %v: %s", cmd["cmd"], l)
	}
}

// goAhead ends a probe loop and reads its "ok".
func (p *pyEngine) goAhead() {
	p.t.Helper()
	if _, err := io.WriteString(p.in, "go\n"); err != nil {
		p.t.Fatal(err)
	}
	if !p.out.Scan() || p.out.Text() != "ok" {
		p.t.Fatalf("probe did not end: %q", p.out.Text())
	}
}

func pyStored(keys ...uint64) map[string]any {
	return map[string]any{"kind": "stored", "hashes": keys, "parent": nil, "tokens": []int{}, "block_size": 16}
}

// TestInteropLibzmqPublisher follows a libzmq (pyzmq) publisher through replay
// bootstrap, both layouts, gaps of 10 and 100, a reconnect and an engine restart.
func TestInteropLibzmqPublisher(t *testing.T) {
	for _, topicFrame := range []bool{false, true} {
		name := "replay-3-frames"
		if topicFrame {
			name = "replay-4-frames"
		}
		t.Run(name, func(t *testing.T) { interop(t, topicFrame) })
	}
}

func interop(t *testing.T, topicFrame bool) {
	py := startPyEngine(t)
	addr, raddr := freeAddr(t, 1), freeAddr(t, 1)
	bind := map[string]any{"cmd": "bind", "pub": addr, "replay": raddr, "topic": "kv-events", "topic_frame": topicFrame,
		"backlog": []map[string]any{
			{"layout": "array", "events": []any{pyStored(1, 2, 1<<63)}},
			{"layout": "map", "events": []any{pyStored(3), map[string]any{"kind": "removed", "hashes": []uint64{2}}}},
		}}
	py.do(bind)
	inv := newInv(t)
	m := startManager(t, testConfig(inv), EndpointConfig{Name: "py", Engine: "vllm", Events: addr, Replay: raddr, Topic: "kv-events"})
	st := func() EndpointStatus { return m.Status(0) }
	waitFor(t, "replay bootstrap", func() bool {
		return st().ReplayedBatches == 2 && slices.Equal(invKeys(inv, 0), []uint64{1, 3, 1 << 63})
	})
	// Wait until the subscription has reached libzmq (probe messages get through).
	py.send(map[string]any{"cmd": "probe"})
	waitFor(t, "subscription", func() bool { return st().TopicSkipped > 0 })
	py.goAhead()

	py.do(map[string]any{"cmd": "publish", "layout": "map", "events": []any{pyStored(4)}})
	waitFor(t, "live map batch", func() bool { return st().Keys == 4 })
	py.do(map[string]any{"cmd": "publish", "layout": "array", "seq": 2 + 1 + 10, "events": []any{pyStored(5)}})
	waitFor(t, "gap 10", func() bool { return st().GapsKept == 1 && st().Keys == 5 })
	py.do(map[string]any{"cmd": "publish", "layout": "array", "seq": 14 + 100, "events": []any{pyStored(6)}})
	// Counters move before the batch is applied: wait on the inventory itself.
	waitFor(t, "gap 100", func() bool { return st().GapsCleared == 1 && slices.Equal(invKeys(inv, 0), []uint64{6}) })

	// The engine's sockets go away; two batches are published meanwhile; it comes back
	// on the same ports with seq continuing: a near reconnect keeps the inventory and
	// replays what was missed.
	py.do(map[string]any{"cmd": "close"})
	waitFor(t, "disconnect", func() bool { return !st().Connected })
	rebind := map[string]any{"cmd": "bind", "pub": addr, "replay": raddr, "topic": "kv-events", "topic_frame": topicFrame,
		"backlog": []map[string]any{{"layout": "array", "events": []any{pyStored(7)}}, {"layout": "map", "events": []any{pyStored(8)}}}}
	py.do(rebind)
	waitFor(t, "reconnect + replay", func() bool { return st().Reconnects >= 1 && st().Keys == 3 && st().LastSeq == 116 })
	if s := st(); s.GapsCleared != 1 || s.Restarts != 0 || s.LastSeq != 116 {
		t.Fatalf("after reconnect: %+v", s)
	}

	// Engine restart: seq back to 0.
	py.do(map[string]any{"cmd": "reset"})
	py.send(map[string]any{"cmd": "probe"})
	base := st().TopicSkipped
	waitFor(t, "subscription", func() bool { return st().TopicSkipped > base })
	py.goAhead()
	py.do(map[string]any{"cmd": "publish", "layout": "map", "events": []any{pyStored(9), map[string]any{"kind": "cleared"}, pyStored(10)}})
	waitFor(t, "restart", func() bool {
		return st().Restarts == 1 && st().EventsCleared == 1 && slices.Equal(invKeys(inv, 0), []uint64{10})
	})
	if s := st(); s.DecodeErrors != 0 {
		t.Fatalf("decode errors: %+v", s)
	}
	py.do(map[string]any{"cmd": "exit"})
}
