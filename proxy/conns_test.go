package proxy

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/cloudwego/hertz/pkg/network"
)

// recordingConn is the transport under a trackedConn: what reaches hertz's buffer, in order.
type recordingConn struct {
	network.Conn
	ops []string
	out bytes.Buffer
}

func (r *recordingConn) WriteBinary(b []byte) (int, error) {
	r.ops = append(r.ops, "binary:"+string(b[:min(len(b), 6)]))
	r.out.Write(b)
	return len(b), nil
}
func (r *recordingConn) Malloc(n int) ([]byte, error) {
	r.ops = append(r.ops, "malloc")
	return make([]byte, n), nil
}
func (r *recordingConn) Write(b []byte) (int, error) {
	r.ops = append(r.ops, "write")
	r.out.Write(b)
	return len(b), nil
}
func (r *recordingConn) Flush() error { r.ops = append(r.ops, "flush"); return nil }

// The request header waits for its body: a large body leaves joined with it in one buffer
// (one write at Flush), a small one or none after it as hertz would write them; any other
// write first releases the header. The bytes and their order never change.
func TestTrackedConnJoinsHeaderAndBody(t *testing.T) {
	hdr := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\n" + hdrConnTag + ": 7\r\n\r\n")
	large := []byte(strings.Repeat("b", 16<<10))
	huge := []byte(strings.Repeat("h", joinMax))
	small := []byte(`{"model":"m"}`)
	cases := []struct {
		name  string
		write func(c *trackedConn)
		ops   []string
		want  string
	}{
		{"large body", func(c *trackedConn) { c.WriteBinary(hdr); c.WriteBinary(large); c.Flush() },
			[]string{"binary:POST /", "flush"}, string(hdr) + string(large)},
		{"small body", func(c *trackedConn) { c.WriteBinary(hdr); c.WriteBinary(small); c.Flush() },
			[]string{"binary:POST /", "binary:{\"mode", "flush"}, string(hdr) + string(small)},
		{"body over the join bound", func(c *trackedConn) { c.WriteBinary(hdr); c.WriteBinary(huge); c.Flush() },
			[]string{"binary:POST /", "binary:hhhhhh", "flush"}, string(hdr) + string(huge)},
		{"no body", func(c *trackedConn) { c.WriteBinary(hdr); c.Flush() },
			[]string{"binary:POST /", "flush"}, string(hdr)},
		{"streamed body", func(c *trackedConn) { c.WriteBinary(hdr); c.Write(small); c.Flush() },
			[]string{"binary:POST /", "write", "flush"}, string(hdr) + string(small)},
		{"malloc after header", func(c *trackedConn) { c.WriteBinary(hdr); c.Malloc(4); c.Flush() },
			[]string{"binary:POST /", "malloc", "flush"}, string(hdr)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recordingConn{}
			c := &trackedConn{Conn: rec, addr: "e:1", reg: newConnRegistry()}
			for round := range 2 { // the second request on the connection starts clean
				rec.ops, rec.out = nil, bytes.Buffer{}
				tc.write(c)
				if strings.Join(rec.ops, " | ") != strings.Join(tc.ops, " | ") {
					t.Fatalf("round %d: ops %q, want %q", round, rec.ops, tc.ops)
				}
				if rec.out.String() != tc.want {
					t.Fatalf("round %d: %d bytes written, want %d (or out of order)", round, rec.out.Len(), len(tc.want))
				}
				if c.held || c.joined != nil {
					t.Fatalf("round %d: header still held (%v) or joined buffer kept (%v) after Flush", round, c.held, c.joined != nil)
				}
			}
			if c.reg.take(exchangeKey{"e:1", 7}) != c {
				t.Fatal("the connection is not registered under its exchange tag")
			}
		})
	}
}

// parseTag reads back exactly the numbers do writes, and nothing else.
func TestParseTag(t *testing.T) {
	for _, n := range []uint64{0, 1, 7, 10, 99, 12345678901234567890, ^uint64(0)} {
		if got, ok := parseTag(strconv.AppendUint(nil, n, 10)); !ok || got != n {
			t.Fatalf("parseTag(%d) = %d, %v", n, got, ok)
		}
	}
	for _, bad := range []string{"", "-1", "1a", " 1", "18446744073709551616", "999999999999999999999", "1\r"} {
		if got, ok := parseTag([]byte(bad)); ok {
			t.Fatalf("parseTag(%q) = %d, accepted", bad, got)
		}
	}
}

// A connection registered under its header's tag is found under do's key, a tag that is
// no number of do's registers nothing, and a cancelled exchange refuses the connection.
func TestConnRegistryKeys(t *testing.T) {
	r := newConnRegistry()
	c := &trackedConn{addr: "e:1", reg: r}
	if !r.set("e:1", []byte("42"), c) || r.take(exchangeKey{"e:1", 42}) != c {
		t.Fatal("the connection is not found under (address, 42)")
	}
	if !r.set("e:1", []byte("x42"), c) || r.m.Size() != 0 {
		t.Fatal("a foreign tag was registered")
	}
	r.cancel(exchangeKey{"e:1", 43})
	if r.set("e:1", []byte("43"), c) {
		t.Fatal("a cancelled exchange accepted its connection")
	}
	if r.set("e:2", []byte("43"), c) != true {
		t.Fatal("the cancel of one address's exchange reached another's")
	}
}

// Registering and taking an exchange costs only the map's entry (the joined string keys
// cost two more allocations per request).
func TestConnRegistryAllocs(t *testing.T) {
	r := newConnRegistry()
	c := &trackedConn{addr: "e:1", reg: r}
	tag := []byte("123456")
	if n := testing.AllocsPerRun(200, func() {
		r.set("e:1", tag, c)
		r.take(exchangeKey{"e:1", 123456})
	}); n > 1 {
		t.Fatalf("%v allocations per set and take, want at most 1", n)
	}
}
