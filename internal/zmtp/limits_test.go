package zmtp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"
)

// TestEmptyFramesCountAgainstTheLimit: a PUB that sends a message of empty frames, each
// with MORE, never ends it. Empty frames add nothing to the message's octets, but each
// costs the Sub a frame entry: before, MaxMessage never tripped and the Sub kept a
// slot per 2-octet frame header for as long as the peer kept sending (the limit is
// 64 KiB here, the peer sends 4 MiB of headers). Recv must refuse the message as too
// large instead.
func TestEmptyFramesCountAgainstTheLimit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write(cat(greeting(3, 1, "NULL"), readyPUB))
		go func() { // drain what the subscriber sends
			buf := make([]byte, 512)
			for {
				if _, err := c.Read(buf); err != nil {
					return
				}
			}
		}()
		empty := bytes.Repeat([]byte{flagMore, 0}, 1<<20) // 1M empty frames, 2 MiB
		for range 2 {
			if _, err := c.Write(empty); err != nil {
				return
			}
		}
		time.Sleep(3 * time.Second) // hold the message open: no EOF to end Recv
	}()
	s, err := Dial(context.Background(), "tcp://"+ln.Addr().String(), Options{Timeout: time.Second, MaxMessage: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = recvWithin(t, s, 10*time.Second)
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Recv: %v, want ErrTooLarge (the Sub holds %d frame entries)", err, cap(s.ends))
	}
}

// libzmqReplay is vLLM's replay service (ZmqEventPublisher._service_replay in
// vllm/distributed/kv_events.py) on a libzmq ROUTER: for a request [id, "", start] it
// sends [id, "", seq, payload] for each buffered seq >= start, then [id, "", -1, ""].
const libzmqReplay = `
import sys, zmq
ctx = zmq.Context()
s = ctx.socket(zmq.ROUTER)
port = s.bind_to_random_port("tcp://127.0.0.1")
print(port, flush=True)
buf = [(i, bytes([i]) * (i * 10000)) for i in range(10)]
ident, empty, start = s.recv_multipart()
start = int.from_bytes(start, "big")
for seq, payload in buf:
    if seq >= start:
        s.send_multipart((ident, b"", seq.to_bytes(8, "big"), payload))
s.send_multipart((ident, b"", (-1).to_bytes(8, "big", signed=True), b""))
sys.stdin.read()
`

// TestDealerLibzmqRouter: the DEALER the replay uses, against libzmq's ROUTER (python3-zmq
// from Debian) answering as vLLM's replay service does: the request reaches it with its
// delimiter, and every reply arrives, short and long frames, then the end marker.
func TestDealerLibzmqRouter(t *testing.T) {
	_, sc := startPythonArgs(t, "-c", libzmqReplay)
	if !sc.Scan() {
		t.Fatal("python3 printed no port (python3-zmq missing?)")
	}
	d, err := DialDealer(context.Background(), "tcp://127.0.0.1:"+sc.Text(), Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.PeerSocketType() != "ROUTER" {
		t.Fatalf("peer %q", d.PeerSocketType())
	}
	if err := d.Send(nil, binary.BigEndian.AppendUint64(nil, 3)); err != nil {
		t.Fatal(err)
	}
	for want := uint64(3); ; want++ {
		f, err := recvTimeout(t, d.Sub, 5*time.Second)
		if err != nil {
			t.Fatalf("reply %d: %v", want, err)
		}
		if len(f) != 3 || len(f[0]) != 0 || len(f[1]) != 8 {
			t.Fatalf("reply %d: %d frames", want, len(f))
		}
		seq := binary.BigEndian.Uint64(f[1])
		if seq == ^uint64(0) {
			if want != 10 {
				t.Fatalf("end marker after seq %d", want-1)
			}
			return
		}
		if seq != want || !bytes.Equal(f[2], bytes.Repeat([]byte{byte(seq)}, int(seq)*10000)) {
			t.Fatalf("reply seq %d (want %d), %d octets", seq, want, len(f[2]))
		}
	}
}
