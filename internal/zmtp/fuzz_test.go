package zmtp

import (
	"bytes"
	"context"
	"io"
	"testing"
)

// rw is a peer stream from fuzz input; what the subscriber writes is discarded.
type rw struct{ io.Reader }

func (rw) Write(p []byte) (int, error) { return len(p), nil }

// FuzzRecv feeds arbitrary peer bytes to the handshake and frame decoder: it must
// return messages within the size limit or an error, never panic or loop.
func FuzzRecv(f *testing.F) {
	ok := cat(greeting(3, 1, "NULL"), readyPUB)
	f.Add(cat(ok, vllmMessage(10), vllmMessage(300)))
	f.Add(cat(ok, []byte("\x04\x0b\x04PING\x00\x64ctx1\x00\x03two")))
	f.Add(cat(greeting(3, 0, "NULL"), readyType("XPUB"), []byte("\x01\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x01x")))
	f.Add(cat(ok, []byte("\x04\x0a\x05ERROR\x03bye")))
	f.Add(cat(ok, []byte("\x03\xff\xff\xff\xff\xff\xff\xff\xff")))
	f.Add([]byte("\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f\x01\x01"))
	const limit = 1 << 16
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Handshake(context.Background(), rw{bytes.NewReader(data)}, Options{Subscribe: []string{"kv"}, MaxMessage: limit})
		if err != nil {
			return
		}
		for i := 0; i <= len(data); i++ { // each message consumes at least one octet
			frames, err := s.Recv()
			if err != nil {
				return
			}
			n := 0
			for _, fr := range frames {
				n += len(fr)
			}
			if n > limit || len(frames) == 0 {
				t.Fatalf("message of %d frames, %d octets (limit %d)", len(frames), n, limit)
			}
		}
		t.Fatal("Recv kept returning messages past the end of the input")
	})
}
