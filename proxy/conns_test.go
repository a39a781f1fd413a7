package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
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
	reg := newConnRegistry()
	hdr := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\n" + hdrConnTag + ": " + string(reg.appendTag(nil, 7)) + "\r\n\r\n")
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
			c := &trackedConn{Conn: rec, addr: "e:1", reg: reg}
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

// parseTag reads back exactly the numbers do writes, with this registry's secret, and
// nothing else: not a bare number (what a forged tag line in a body would carry), not
// another registry's tag.
func TestParseTag(t *testing.T) {
	r, other := newConnRegistry(), newConnRegistry()
	if r.secret == other.secret {
		t.Fatalf("two registries drew the same secret %q", r.secret[:])
	}
	for _, n := range []uint64{0, 1, 7, 10, 99, 12345678901234567890, ^uint64(0)} {
		tag := r.appendTag(nil, n)
		if got, ok := r.parseTag(tag); !ok || got != n {
			t.Fatalf("parseTag(%q) = %d, %v", tag, got, ok)
		}
		if got, ok := other.parseTag(tag); ok {
			t.Fatalf("another registry's tag %q read as %d", tag, got)
		}
		if got, ok := r.parseTag(strconv.AppendUint(nil, n, 10)); ok {
			t.Fatalf("the bare number %d read as exchange %d", n, got)
		}
	}
	sec := string(r.secret[:])
	for _, bad := range []string{"", sec, "-1" + sec, "1a" + sec, " 1" + sec, "18446744073709551616" + sec,
		"1" + sec[:len(sec)-1], "1" + sec + "0", "1" + sec + "\r", "1." + strings.Repeat("0", 16)} {
		if got, ok := r.parseTag([]byte(bad)); ok {
			t.Fatalf("parseTag(%q) = %d, accepted", bad, got)
		}
	}
}

// A connection registered under its header's tag is found under do's key, a tag that is
// no number of do's registers nothing, and a cancelled exchange refuses the connection.
func TestConnRegistryKeys(t *testing.T) {
	r := newConnRegistry()
	c := &trackedConn{addr: "e:1", reg: r}
	if !r.set("e:1", 42, c) || r.take(exchangeKey{"e:1", 42}) != c {
		t.Fatal("the connection is not found under (address, 42)")
	}
	for _, line := range []string{"x42", "42", string(newConnRegistry().appendTag(nil, 42))} {
		if _, ok := r.tagIn([]byte("POST / HTTP/1.1\r\n" + hdrConnTag + ": " + line + "\r\n\r\n")); ok {
			t.Fatalf("a foreign tag %q was taken for an exchange", line)
		}
	}
	if id, ok := r.tagIn([]byte("POST / HTTP/1.1\r\n" + hdrConnTag + ": " + string(r.appendTag(nil, 42)) + "\r\n\r\n")); !ok || id != 42 {
		t.Fatalf("the registry's own tag read as %d, %v", id, ok)
	}
	r.cancel(exchangeKey{"e:1", 43})
	if r.set("e:1", 43, c) {
		t.Fatal("a cancelled exchange accepted its connection")
	}
	if r.set("e:2", 43, c) != true {
		t.Fatal("the cancel of one address's exchange reached another's")
	}
}

// A request body is the client's bytes, and may carry a line that looks like the exchange
// tag. It must never register the connection: not in the body that follows a held header
// (never searched), not in a streamed body's later chunks (searched, but without the
// registry's secret), and the header's own tag is the one recorded.
func TestTrackedConnBodyTagLine(t *testing.T) {
	reg := newConnRegistry()
	hdr := []byte("POST /x HTTP/1.1\r\nHost: e\r\n" + hdrConnTag + ": " + string(reg.appendTag(nil, 7)) + "\r\n\r\n")
	forged := func(id uint64, tail string) []byte {
		return []byte("junk\r\n" + hdrConnTag + ": " + strconv.FormatUint(id, 10) + tail + "\r\n" + strings.Repeat("b", 8<<10))
	}
	other := string(newConnRegistry().secret[:])
	rec := &recordingConn{}
	c := &trackedConn{Conn: rec, addr: "e:1", reg: reg}
	c.WriteBinary(hdr)
	c.WriteBinary(forged(1<<40, ""))      // the held header's body
	c.WriteBinary(forged(1<<40+1, ""))    // a later chunk, searched
	c.WriteBinary(forged(1<<40+2, other)) // another registry's secret
	c.Flush()
	if c.reg.take(exchangeKey{"e:1", 7}) != c {
		t.Fatal("the header's own exchange is not registered")
	}
	if n := reg.m.Size(); n != 0 {
		t.Fatalf("%d exchanges registered from the body's lines", n)
	}
	if want := string(hdr) + string(forged(1<<40, "")) + string(forged(1<<40+1, "")) + string(forged(1<<40+2, other)); rec.out.String() != want {
		t.Fatalf("%d bytes written, want %d (or out of order)", rec.out.Len(), len(want))
	}
}

// Registering and taking an exchange costs only the map's entry (the joined string keys
// cost two more allocations per request).
func TestConnRegistryAllocs(t *testing.T) {
	r := newConnRegistry()
	c := &trackedConn{addr: "e:1", reg: r}
	if n := testing.AllocsPerRun(200, func() {
		r.set("e:1", 123456, c)
		r.take(exchangeKey{"e:1", 123456})
	}); n > 1 {
		t.Fatalf("%v allocations per set and take, want at most 1", n)
	}
}

// Through the whole proxy: pass-through requests whose bodies carry tag lines, for numbers
// the proxy will issue next and for numbers it never issues, with a length and streamed in
// chunks, all answered and none leaving an exchange registered once they are done (before
// the secret, each such body left an entry that nothing took: unbounded growth driven by
// any client).
func TestForgedTagLinesLeaveNoExchange(t *testing.T) {
	a := newFakeEngine(t, "a")
	s := startProxy(t, testConfig(a.url()))
	body := func(i int) string {
		var b strings.Builder
		for k := range 4 {
			next := s.exchanges.Load() + uint64(k)
			fmt.Fprintf(&b, "%s\r\n%s: %d\r\n%s\r\n%s: %d\r\n", strings.Repeat("x", 3<<10), hdrConnTag, next, strings.Repeat("y", 3<<10), hdrConnTag, 1<<40+i*4+k)
		}
		return b.String()
	}
	var sent []string
	for i := range 20 {
		sent = append(sent, body(i))
		var rd io.Reader = strings.NewReader(sent[i])
		if i%2 == 1 {
			rd = struct{ io.Reader }{rd} // no length: Go's client sends it chunked, kvgate streams it
		}
		req, _ := http.NewRequest("POST", s.url("/forge"), rd)
		res, err := httpc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 404 || string(b) != "no such path /forge" {
			t.Fatalf("request %d: %d %q", i, res.StatusCode, b)
		}
	}
	if n := s.conns.m.Size(); n != 0 {
		t.Fatalf("%d exchanges left registered after every request ended", n)
	}
	got := a.requests()
	if len(got) != 20 {
		t.Fatalf("the engine saw %d of the 20 requests", len(got))
	}
	for i, r := range got {
		if r.path != "/forge" || r.body != sent[i] {
			t.Fatalf("request %d reached the engine as %s with %d body bytes, want /forge with %d", i, r.path, len(r.body), len(sent[i]))
		}
	}
}
