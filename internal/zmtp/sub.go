package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"
)

// Defaults for Options.
const (
	DefaultMaxMessage = 64 << 20 // a vLLM batch of a 128k-token prompt's stores is < 1 MiB
	DefaultReadBuffer = 16 << 10 // dozens of typical event batches per read syscall
	// maxCommand bounds a command frame (READY, PING, ...): commands are small; a larger
	// one is a peer that is not speaking ZMTP to us.
	maxCommand = 64 << 10
	// frameCost is what a frame counts against MaxMessage besides its body: the memory
	// Recv keeps for it (its end offset and its result slice).
	frameCost = 32
	// pongTimeout bounds writing a PONG: the reader must not block behind a peer that
	// does not read its socket.
	pongTimeout = time.Second
)

// Options configures a subscriber connection.
type Options struct {
	// Subscribe lists the topic prefixes to subscribe to ("" = every message). A SUB
	// with none receives nothing (ZeroMQ's PUB filters on its side).
	Subscribe []string
	// Timeout bounds the TCP connect and, separately, the ZMTP handshake (greeting,
	// READY both ways). 0 = no bound.
	Timeout time.Duration
	// MaxMessage bounds one message (all its frames, each counting frameCost octets
	// besides its body); a larger one is ErrTooLarge. 0 = DefaultMaxMessage.
	MaxMessage int
	// ReadBuffer is the buffered reader's size. 0 = DefaultReadBuffer.
	ReadBuffer int
}

// Sub is one subscriber connection to a PUB (or XPUB) peer. Recv is not safe for
// concurrent use; Close may be called from any goroutine, and unblocks Recv.
type Sub struct {
	frameReader
	conn   net.Conn // nil when the stream is not a net.Conn (tests, fuzzing)
	w      io.Writer
	maxMsg int

	major, minor byte
	peerType     string

	body   []byte   // the current message's frame bodies, end to end
	ends   []int    // each frame's end offset in body
	frames [][]byte // Recv's result: subslices of body
	out    []byte   // scratch for what we write (PONG)
}

// role is a socket type this package connects as, and the peer types it accepts.
type role struct {
	own   string
	peers []string
}

var (
	subRole    = role{"SUB", []string{"PUB", "XPUB"}}
	dealerRole = role{"DEALER", []string{"ROUTER"}}
)

// Dial connects to addr ("tcp://host:port"), runs the ZMTP handshake and subscribes.
// ctx cancels the connect and the handshake, not the connection after Dial returns.
func Dial(ctx context.Context, addr string, opt Options) (*Sub, error) {
	return dial(ctx, addr, opt, subRole)
}

func dial(ctx context.Context, addr string, opt Options, r role) (*Sub, error) {
	hostport, ok := strings.CutPrefix(addr, "tcp://")
	if !ok {
		return nil, fmt.Errorf("zmtp: %q: only tcp://host:port is supported", addr)
	}
	d := net.Dialer{Timeout: opt.Timeout}
	conn, err := d.DialContext(ctx, "tcp", hostport)
	if err != nil {
		return nil, err
	}
	s, err := handshake(ctx, conn, opt, r)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return s, nil
}

// Handshake runs the ZMTP handshake as a SUB over an established stream and sends the
// subscriptions. If rw is a net.Conn, opt.Timeout and ctx bound the handshake through
// its deadline, and the Sub's Close closes it.
func Handshake(ctx context.Context, rw io.ReadWriter, opt Options) (*Sub, error) {
	return handshake(ctx, rw, opt, subRole)
}

func handshake(ctx context.Context, rw io.ReadWriter, opt Options, r role) (*Sub, error) {
	if opt.MaxMessage <= 0 {
		opt.MaxMessage = DefaultMaxMessage
	}
	if opt.ReadBuffer <= 0 {
		opt.ReadBuffer = DefaultReadBuffer
	}
	src := io.Reader(rw)
	c, isConn := rw.(net.Conn)
	if isConn {
		src = socketSource(c)
	}
	s := &Sub{frameReader: frameReader{rd: bufio.NewReaderSize(src, opt.ReadBuffer)}, w: rw, maxMsg: opt.MaxMessage}
	if isConn {
		s.conn = c
		if opt.Timeout > 0 {
			c.SetDeadline(time.Now().Add(opt.Timeout)) //nolint:errcheck // a closed conn fails the reads below
		}
		stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) }) //nolint:errcheck
		defer stop()
	}
	if err := s.handshake(r, opt.Subscribe); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	if s.conn != nil {
		if err := s.conn.SetDeadline(time.Time{}); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *Sub) handshake(r role, topics []string) error {
	var err error
	s.major, s.minor, s.peerType, s.out, err = s.greet(s.w, s.out, r.own, r.peers...)
	if err != nil {
		return err
	}
	s.out = s.out[:0]
	for _, t := range topics {
		s.out = appendSubscribe(s.out, t, s.major, s.minor)
	}
	if len(s.out) > 0 {
		if _, err := s.w.Write(s.out); err != nil {
			return fmt.Errorf("zmtp: sending subscriptions: %w", err)
		}
	}
	return nil
}

// frameReader reads greetings and frames from a buffered stream.
type frameReader struct {
	rd  *bufio.Reader
	hdr [9]byte
	cmd []byte // the current command frame's body
}

// greet runs the greeting and NULL handshake as a socket of type own, accepting a peer
// of one of the types peers: it writes our greeting and READY (through out, returned
// for reuse), reads and checks the peer's, and returns the peer's version and type.
func (r *frameReader) greet(w io.Writer, out []byte, own string, peers ...string) (major, minor byte, peerType string, _ []byte, err error) {
	// Our whole greeting and READY at once: we need no backwards detection (37/ZMTP
	// "Backwards Interoperability": a peer that does not SHOULD send its full greeting),
	// and with NULL the connecting peer sends READY first, the other may as soon as it
	// has read ours. A peer that turns out not to speak 3.x NULL is closed anyway.
	out = appendGreeting(out[:0])
	out = appendReady(out, own)
	if _, err := w.Write(out); err != nil {
		return 0, 0, "", out, fmt.Errorf("zmtp: sending greeting: %w", err)
	}
	var g [greetingSize]byte
	// The signature and major version first: a ZMTP 1.0 or 2.0 peer sends fewer than 64
	// octets and would wait for us.
	if _, err := io.ReadFull(r.rd, g[:sigSize+1]); err != nil {
		return 0, 0, "", out, fmt.Errorf("zmtp: reading greeting: %w", readErr(err))
	}
	if g[0] != 0xFF || g[9]&1 == 0 {
		return 0, 0, "", out, fmt.Errorf("%w: signature % x is not ZMTP 2.0 or later", ErrGreeting, g[:sigSize])
	}
	if g[10] < 3 {
		return 0, 0, "", out, fmt.Errorf("%w: peer speaks ZMTP major version %d, need 3", ErrVersion, g[10])
	}
	if _, err := io.ReadFull(r.rd, g[sigSize+1:]); err != nil {
		return 0, 0, "", out, fmt.Errorf("zmtp: reading greeting: %w", readErr(err))
	}
	major, minor = g[10], g[11]
	mech := bytes.TrimRight(g[mechOffset:mechOffset+mechSize], "\x00")
	if string(mech) != "NULL" {
		return 0, 0, "", out, fmt.Errorf("%w: peer offers %q", ErrMechanism, mech)
	}
	// The peer's first frame: READY, or ERROR if it refused ours.
	flags, size, err := r.readHeader()
	if err != nil {
		return 0, 0, "", out, fmt.Errorf("zmtp: reading READY: %w", err)
	}
	if flags&flagCommand == 0 {
		return 0, 0, "", out, fmt.Errorf("%w: first frame after the greeting is a message, want READY", ErrFrame)
	}
	if err := r.readCommand(size); err != nil {
		return 0, 0, "", out, err
	}
	name, data, err := parseCommand(r.cmd)
	if err != nil {
		return 0, 0, "", out, err
	}
	switch string(name) {
	case "READY":
	case "ERROR":
		return 0, 0, "", out, fmt.Errorf("%w: %q", ErrPeer, errorReason(data))
	default:
		return 0, 0, "", out, fmt.Errorf("%w: first command is %q, want READY", ErrFrame, name)
	}
	typ, found, err := readyProperty(data, "Socket-Type")
	if err != nil {
		return 0, 0, "", out, err
	}
	for _, p := range peers {
		if found && equalFold(typ, p) {
			return major, minor, string(typ), out, nil
		}
	}
	// 37/ZMTP: a peer that rejects the socket type SHOULD say so with ERROR.
	out = appendCommand(out[:0], "ERROR", []byte{byte(len("invalid socket type"))}, []byte("invalid socket type"))
	w.Write(out) //nolint:errcheck // closing anyway
	if !found {
		return 0, 0, "", out, fmt.Errorf("%w: READY has no Socket-Type", ErrSocketType)
	}
	return 0, 0, "", out, fmt.Errorf("%w: peer is %q, want %s", ErrSocketType, typ, strings.Join(peers, " or "))
}

func errorReason(data []byte) []byte {
	if len(data) == 0 {
		return nil
	}
	n := min(int(data[0]), len(data)-1)
	return data[1 : 1+n]
}

// readErr names a stream that ended inside a greeting or frame.
func readErr(err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("connection ended inside a frame (truncated): %w", err)
	}
	return err
}

// Version is the ZMTP version the peer announced.
func (s *Sub) Version() (major, minor byte) { return s.major, s.minor }

// PeerSocketType is the Socket-Type the peer announced in its READY.
func (s *Sub) PeerSocketType() string { return s.peerType }

// Close closes the connection; a blocked Recv returns an error.
func (s *Sub) Close() error {
	if s.conn == nil {
		return nil
	}
	return s.conn.Close()
}

// readHeader reads a frame's flags and size.
func (r *frameReader) readHeader() (flags byte, size uint64, err error) {
	flags, err = r.rd.ReadByte()
	if err != nil {
		return 0, 0, err // io.EOF here is a clean close between frames
	}
	if flags&flagReserved != 0 {
		return 0, 0, fmt.Errorf("%w: reserved flag bits set (flags %#02x)", ErrFrame, flags)
	}
	if flags&flagLong == 0 {
		b, err := r.rd.ReadByte()
		if err != nil {
			return 0, 0, readErr(io.ErrUnexpectedEOF)
		}
		return flags, uint64(b), nil
	}
	if _, err := io.ReadFull(r.rd, r.hdr[:8]); err != nil {
		return 0, 0, readErr(noEOF(err))
	}
	size = binary.BigEndian.Uint64(r.hdr[:8])
	if size > 1<<63-1 {
		return 0, 0, fmt.Errorf("%w: frame size %d is over 2^63-1", ErrFrame, size)
	}
	return flags, size, nil
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// readCommand reads a command frame's body of size octets into s.cmd.
func (r *frameReader) readCommand(size uint64) error {
	if size > maxCommand {
		return fmt.Errorf("%w: command frame of %d octets (limit %d)", ErrTooLarge, size, maxCommand)
	}
	var err error
	r.cmd, err = r.readBody(r.cmd[:0], int(size))
	return err
}

// readBody appends n octets from the stream to dst, growing it as the octets arrive (a
// peer that announces a large frame and sends less costs what it sent, not what it
// announced).
func (r *frameReader) readBody(dst []byte, n int) ([]byte, error) {
	for n > 0 {
		if len(dst) == cap(dst) {
			dst = slices.Grow(dst, min(n, max(cap(dst), 4096)))
		}
		chunk := min(n, cap(dst)-len(dst))
		m, err := io.ReadFull(r.rd, dst[len(dst):len(dst)+chunk])
		dst = dst[:len(dst)+m]
		if err != nil {
			return dst, readErr(noEOF(err))
		}
		n -= chunk
	}
	return dst, nil
}

// Recv returns the next message's frames. They stay valid until the next Recv, which
// reuses their memory. Commands between messages are handled here: PING gets a PONG,
// ERROR ends the connection, the others (PONG, SUBSCRIBE, CANCEL, and commands this
// package does not know) are skipped. io.EOF: the peer closed the connection cleanly.
func (s *Sub) Recv() ([][]byte, error) {
	s.body, s.ends = s.body[:0], s.ends[:0]
	for {
		flags, size, err := s.readHeader()
		if err != nil {
			if err == io.EOF && len(s.ends) > 0 {
				err = readErr(io.ErrUnexpectedEOF) // closed inside a multipart message
			}
			return nil, err
		}
		if flags&flagCommand != 0 {
			if len(s.ends) > 0 {
				return nil, fmt.Errorf("%w: command frame inside a multipart message", ErrFrame)
			}
			if flags&flagMore != 0 {
				return nil, fmt.Errorf("%w: command frame with the MORE flag", ErrFrame)
			}
			if err := s.readCommand(size); err != nil {
				return nil, err
			}
			if err := s.command(); err != nil {
				return nil, err
			}
			continue
		}
		// Each frame costs frameCost besides its body: a message of empty frames adds no
		// octets but an entry per frame, and must meet the limit too.
		used := len(s.body) + frameCost*(len(s.ends)+1)
		if used > s.maxMsg || size > uint64(s.maxMsg-used) {
			return nil, fmt.Errorf("%w: %d octets in %d frames with this one (limit %d)", ErrTooLarge, uint64(len(s.body))+size, len(s.ends)+1, s.maxMsg)
		}
		s.body, err = s.readBody(s.body, int(size))
		if err != nil {
			return nil, err
		}
		s.ends = append(s.ends, len(s.body))
		if flags&flagMore == 0 {
			break
		}
	}
	s.frames = s.frames[:0]
	start := 0
	for _, end := range s.ends {
		s.frames = append(s.frames, s.body[start:end:end])
		start = end
	}
	return s.frames, nil
}

// command handles one command frame between messages (s.cmd).
func (s *Sub) command() error {
	name, data, err := parseCommand(s.cmd)
	if err != nil {
		return err
	}
	switch string(name) {
	case "PING":
		// 37/ZMTP "Connection Heartbeating": reply PONG echoing the context (after the
		// 2-octet TTL, at most 16 octets).
		if len(data) < 2 {
			return fmt.Errorf("%w: PING without its TTL", ErrFrame)
		}
		ctx := data[2:]
		if len(ctx) > 16 {
			return fmt.Errorf("%w: PING context of %d octets (limit 16)", ErrFrame, len(ctx))
		}
		s.out = appendCommand(s.out[:0], "PONG", ctx)
		if s.conn != nil {
			s.conn.SetWriteDeadline(time.Now().Add(pongTimeout)) //nolint:errcheck
			defer s.conn.SetWriteDeadline(time.Time{})           //nolint:errcheck
		}
		if _, err := s.w.Write(s.out); err != nil {
			return fmt.Errorf("zmtp: sending PONG: %w", err)
		}
	case "ERROR":
		return fmt.Errorf("%w: %q", ErrPeer, errorReason(data))
	}
	return nil
}

// Dealer is one DEALER connection to a ROUTER peer (an engine's replay socket): Send
// writes a request, Recv reads the replies as a Sub reads messages, under the same
// Options (the handshake's deadline, MaxMessage, PINGs answered). Why not zmq4's DEALER:
// its handshake has no deadline (a peer that accepts and never greets kept a goroutine
// and the socket for as long as it held the connection) and it allocates whatever size
// a frame announces (2^62 octets: a panic in its reader goroutine, which ends the
// process). Send and Recv are for one goroutine; Close may be called from any.
type Dealer struct{ *Sub }

// DialDealer connects to addr ("tcp://host:port") and runs the ZMTP handshake as a
// DEALER (opt.Subscribe is not used). ctx and opt.Timeout bound the connect and the
// handshake, as Dial's; nothing bounds Send or Recv after that but Close.
func DialDealer(ctx context.Context, addr string, opt Options) (*Dealer, error) {
	opt.Subscribe = nil
	s, err := dial(ctx, addr, opt, dealerRole)
	if err != nil {
		return nil, err
	}
	return &Dealer{s}, nil
}

// Send writes one message of frames (all but the last with MORE).
func (d *Dealer) Send(frames ...[]byte) error {
	d.out = d.out[:0]
	for i, f := range frames {
		flags := byte(0)
		if i < len(frames)-1 {
			flags = flagMore
		}
		d.out = appendFrameHeader(d.out, flags, len(f))
		d.out = append(d.out, f...)
	}
	if _, err := d.w.Write(d.out); err != nil {
		return fmt.Errorf("zmtp: sending: %w", err)
	}
	return nil
}
