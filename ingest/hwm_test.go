package ingest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/kvgate/kvgate/internal/testfix"
)

// floodEngine is a libzmq (pyzmq) vLLM publisher whose PUB has a tiny send high-water
// mark: flooded, libzmq drops whole messages, as a busy engine does. Every batch stays in
// its replay buffer. Protocol: argv pub replay batches keys; prints "ready"; probes
// until stdin says "go"; floods; then sends empty batches until stdin closes.
const floodEngine = `
import sys, time, select, os
import msgpack, zmq
pub_addr, replay_addr, n, k = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ctx = zmq.Context.instance()
pub = ctx.socket(zmq.PUB)
pub.setsockopt(zmq.SNDHWM, 8)
pub.setsockopt(zmq.SNDBUF, 4096)
pub.bind(pub_addr)
router = ctx.socket(zmq.ROUTER)
router.setsockopt(zmq.SNDHWM, 0)  # replay replies are never dropped
router.bind(replay_addr)
END = b"\xff" * 8
buf = []
def batch(i):
    hashes = [1 + i * k + j for j in range(k)]
    ev = ["BlockStored", hashes, None, [], 16, None, "GPU", None]
    return msgpack.packb([time.time(), [ev], 0])
def serve_replay():
    while router.poll(0):
        f = router.recv_multipart()
        start = int.from_bytes(f[-1], "big")
        for s in range(start, len(buf)):
            router.send_multipart([f[0], b"", s.to_bytes(8, "big"), buf[s]])
        router.send_multipart([f[0], b"", END, b""])
print("ready", flush=True)
while not select.select([0], [], [], 0.01)[0]:
    pub.send_multipart([b"kv-probe", bytes(8), b""])
    serve_replay()
os.read(0, 16)
dropped = 0
for i in range(n):
    buf.append(batch(i))
    try:
        pub.send_multipart([b"kv", i.to_bytes(8, "big"), buf[i]], flags=zmq.NOBLOCK)
    except zmq.Again:
        dropped += 1
    if i % 64 == 0:
        serve_replay()
print("flooded %d dropped-at-send %d" % (n, dropped), flush=True)
# Then an empty batch every 20 ms (new seqs) until the test is done: the flood's last
# batches may have been dropped too, and only a later batch reveals that gap.
i = n
while not select.select([0], [], [], 0.02)[0]:
    buf.append(msgpack.packb([time.time(), [], 0]))
    try:
        pub.send_multipart([b"kv", i.to_bytes(8, "big"), buf[i]], flags=zmq.NOBLOCK)
    except zmq.Again:
        pass
    i += 1
    serve_replay()
`

// TestFaultFloodPastHighWaterMark: a libzmq engine floods 5 000 batches through a PUB
// whose high-water mark is 8 messages, so libzmq drops many of them. kvgate sees each
// loss as a seq gap, fetches the missing batches from the engine's replay buffer, and
// ends with every key; nothing is cleared.
func TestFaultFloodPastHighWaterMark(t *testing.T) {
	if out, err := exec.Command("/usr/bin/python3", "-c", "import zmq, msgpack").CombinedOutput(); err != nil {
		t.Fatalf("needs /usr/bin/python3 with python3-zmq and python3-msgpack (run `make fetch`): %v\n%s", err, out)
	}
	const batches, keys = 5000, 8
	script := filepath.Join(t.TempDir(), "flood.py")
	if err := os.WriteFile(script, []byte(floodEngine), 0o644); err != nil {
		t.Fatal(err)
	}
	addr, raddr := freeAddr(t, 1), freeAddr(t, 1)
	cmd := exec.Command("/usr/bin/python3", script, addr, raddr, fmt.Sprint(batches), fmt.Sprint(keys))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, _ := cmd.StdinPipe()
	outp, _ := cmd.StdoutPipe()
	cmd.Stderr = &testWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	testfix.ReapOnCleanup(t, cmd, in)
	out := bufio.NewScanner(outp)
	if !out.Scan() || out.Text() != "ready" {
		t.Fatalf("flood engine: %q", out.Text())
	}
	inv := newInv(t)
	m := startManager(t, testConfig(inv), EndpointConfig{Name: "py", Engine: "vllm", Events: addr, Replay: raddr, Topic: "kv"})
	st := func() EndpointStatus { return m.Status(0) }
	waitFor(t, "subscription reached libzmq", func() bool { return st().TopicSkipped > 0 })
	io.WriteString(in, "go\n")
	if !out.Scan() {
		t.Fatal("flood engine died")
	}
	t.Logf("engine: %s", out.Text())
	waitFor(t, "flood applied", func() bool { return st().LastSeq >= batches })
	s := st()
	want := make([]uint64, batches*keys)
	for i := range want {
		want[i] = uint64(i + 1)
	}
	got := invKeys(inv, 0)
	if s.GapsCleared+s.Restarts != 0 || !slices.Equal(got, want) {
		t.Fatalf("after the flood: %d keys of %d; %+v", len(got), len(want), s)
	}
	if s.GapsFilled == 0 {
		t.Logf("no message was dropped on the wire this run: the flood did not pass the mark")
	}
	t.Logf("flood: %d batches, %d live, %d replayed, %d gaps filled from replay, %d kept",
		batches, s.Batches-s.ReplayedBatches, s.ReplayedBatches, s.GapsFilled, s.GapsKept)
}
