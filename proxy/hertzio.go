package proxy

import (
	"bytes"
	"errors"
	"io"
	"time"

	"github.com/cloudwego/hertz/pkg/app"
	"github.com/cloudwego/hertz/pkg/network"
)

// What kvgate does with hertz's requests and responses as an HTTP intermediary, in one
// place: the framing check on what a client sends, the hop-by-hop headers it never
// forwards (either way), and the body reader that fills pooled buffers. Hertz's own
// refusals are rewritten in headerrors.go; connections are tracked in conns.go.

// hopHeaders are per-connection headers a proxy must not forward (RFC 9110 7.6.1).
var hopHeaders = [...]string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// hopHeaderSet is a hertz request or response header.
type hopHeaderSet interface {
	Del(key string)
	DelBytes(key []byte)
	PeekAll(key string) [][]byte
	SetConnectionClose(close bool)
}

// stripHop deletes from h, a copy of a message's header, the hop-by-hop headers and
// those any of its Connection lines names. The names are read from h's own lines, all
// of them: hertz keeps "Connection: close" as a flag, and while it is set Peek and
// PeekAll answer "close" alone, hiding a line such as "Connection: X-Secret" kept
// beside it (a second line, or a response hertz marked close because it has no
// length); Peek also answers only the first of several lines. Clearing the flag first
// uncovers them all (ResetConnectionClose would delete them with it); deleting
// "Connection" below clears it for good. The values stay valid while names are
// deleted: deleting moves h's entries, it never writes their bytes.
func stripHop[H hopHeaderSet](h H) {
	h.SetConnectionClose(false)
	for _, conn := range h.PeekAll("Connection") {
		for len(conn) > 0 {
			f := conn
			if i := bytes.IndexByte(conn, ','); i >= 0 {
				f, conn = conn[:i], conn[i+1:]
			} else {
				conn = nil
			}
			if f = bytes.TrimSpace(f); len(f) > 0 {
				h.DelBytes(f)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

// errBodyTooLarge: appendBody read past its limit.
var errBodyTooLarge = errors.New("body exceeds the limit")

// maxLegBody bounds a P/D leg's answer read whole (pd.go doLeg).
const maxLegBody = 64 << 20

// appendBody reads r to its end onto dst, growing dst only when it is full, so a pooled
// buffer is reused at its size. Past limit bytes it stops with errBodyTooLarge.
func appendBody(dst []byte, r io.Reader, limit int) ([]byte, error) {
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		n, err := r.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if len(dst) > limit {
			return dst, errBodyTooLarge
		}
		if err == io.EOF {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}

// checkFraming refuses a request whose body framing is ambiguous (RFC 9112 6.1, 6.3):
// Transfer-Encoding together with Content-Length, or Content-Length twice (400), or a
// transfer coding other than exactly "chunked" (501; hertz would otherwise read any
// coding as chunked). Either way the connection closes after the answer, so bytes a
// front proxy framed differently can never become a second request. The raw lines
// are read, not hertz's parsed header, because hertz hides exactly these cases: of two
// Content-Length lines it keeps the last (a front proxy may frame by the first), and
// it drops a "Transfer-Encoding: identity" line, framing by Content-Length or as
// empty where the RFC says the length cannot be determined.
func (s *Server) checkFraming(c *app.RequestContext) bool {
	te, cl, coding := framingLines(c.Request.Header.RawHeaders())
	switch {
	case te == 0 && cl <= 1:
		return true
	case te > 0 && cl > 0:
		s.m.bad[BadFraming].Inc()
		writeError(c, 400, "invalid_request_error", "both Content-Length and Transfer-Encoding sent: ambiguous body framing")
	case cl > 1:
		s.m.bad[BadFraming].Inc()
		writeError(c, 400, "invalid_request_error", "more than one Content-Length sent: ambiguous body framing")
	case te > 1 || !bytes.EqualFold(coding, chunkedCoding):
		s.m.bad[BadFraming].Inc()
		writeError(c, 501, "invalid_request_error", "unsupported Transfer-Encoding (only a single \"chunked\" is accepted)")
	default:
		return true
	}
	closeUnread(c)
	return false
}

// framingLines counts raw's Transfer-Encoding and Content-Length lines and returns the
// last transfer coding. It runs on every request: a line is looked at only when its
// name has one of the two lengths.
func framingLines(raw []byte) (te, cl int, coding []byte) {
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		k, v, ok := bytes.Cut(line, []byte{':'})
		if k = bytes.TrimSpace(k); !ok || len(k) != len(hdrTE) && len(k) != len(hdrCL) {
			continue
		}
		switch {
		case bytes.EqualFold(k, hdrTE):
			te++
			coding = bytes.TrimSpace(v)
		case bytes.EqualFold(k, hdrCL):
			cl++
		}
	}
	return te, cl, coding
}

// closeUnread answers and closes a connection whose request body is left unread (a
// refusal before or while reading it). Closing a socket with unread input sends a
// reset, and a client still sending its body then loses the answer before it reads
// it; netpoll's transport read the input eagerly and so hid this, the standard one
// does not. So the connection lingers after the answer (as nginx's lingering_close
// does): its input is read and dropped until the client stops sending or closes, for
// at most lingerTime and lingerBytes, then closed.
func closeUnread(c *app.RequestContext) {
	// Dropping the body stream also keeps hertz from skipping the rest of it after the
	// answer, which fails on a body cut off mid-chunk and closes at once.
	c.Request.ResetBody()
	c.SetConnectionClose()
	c.Hijack(linger)
}

const (
	lingerTime  = 2 * time.Second
	lingerIdle  = 200 * time.Millisecond // no input this long: the client stopped sending
	lingerBytes = 8 << 20
)

func linger(conn network.Conn) {
	end := time.Now().Add(lingerTime)
	buf := make([]byte, 16<<10) // refusals only
	for n := 0; n < lingerBytes; {
		d := time.Now().Add(lingerIdle)
		if d.After(end) {
			d = end
		}
		conn.SetReadDeadline(d) //nolint:errcheck
		m, err := conn.Read(buf)
		n += m
		if err != nil {
			return
		}
	}
}

var (
	hdrTE         = []byte("Transfer-Encoding")
	hdrCL         = []byte("Content-Length")
	chunkedCoding = []byte("chunked")
)
