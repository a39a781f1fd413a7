package zmtp

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"syscall"
)

// serveSlack is what a partial message's wire octets may exceed MaxMessage by before
// Serve calls it too large: its frame headers (2 or 9 octets a frame).
const serveSlack = 64 << 10

// Serve reads messages until the connection ends and calls handle with each one's
// frames, which stay valid until handle returns (they point into the read buffer).
// Commands are handled as Recv handles them. It returns why the connection ended
// (io.EOF: the peer closed it cleanly between messages). Serve takes the Sub over: call
// neither Recv nor Serve after it. handle must not call Close: on a socket, Close waits
// for the read that is calling handle to return.
//
// Why not a loop of Recv: a buffered reader that runs dry asks the socket again, gets
// EAGAIN, and only then parks on the poller, so each batch costs two read syscalls. On
// a TCP connection Serve holds one syscall.RawConn.Read for the connection's life: its
// callback reads, parses and hands off, and after a short read (the socket is drained)
// returns false, so the goroutine parks on the poller with no second read. One long
// call, not one per batch: each RawConn.Read starts by resetting the poller's readiness,
// so a readiness that arrived after the short read would be lost; within one call the
// edge-triggered poller keeps it, and the wait returns at once.
func (s *Sub) Serve(handle func(frames [][]byte)) error {
	s.in = make([]byte, 0, max(s.readBuf, 4096))
	// What the handshake's reader already holds comes first.
	if n := s.rd.Buffered(); n > 0 {
		b, _ := s.rd.Peek(n)
		s.in = append(s.in, b...)
	}
	s.rd = nil // Serve's buffer replaces the reader's
	if err := s.drain(handle); err != nil {
		return err
	}
	if sc, ok := s.conn.(syscall.Conn); ok {
		rc, err := sc.SyscallConn()
		if err == nil {
			return s.serveRaw(rc, handle)
		}
	}
	return s.serveStream(handle)
}

// serveRaw is Serve's loop on a socket: a RawConn.Read that lasts while the socket
// keeps up; after a full read its callback returns, so a Close waiting for the read to
// let go of the descriptor is not held up by a peer that writes faster than we read, and
// the next RawConn.Read's callback reads before it could park (the reset readiness is
// not needed there).
func (s *Sub) serveRaw(rc syscall.RawConn, handle func([][]byte)) error {
	var err error
	read := func(fd uintptr) bool {
		for {
			if len(s.in) == cap(s.in) {
				if err = s.growIn(); err != nil {
					return true
				}
			}
			free := cap(s.in) - len(s.in)
			n, e := syscall.Read(int(fd), s.in[len(s.in):cap(s.in)])
			switch {
			case e == syscall.EINTR:
				continue
			case e == syscall.EAGAIN:
				return false // drained (a spurious readiness): park
			case e != nil:
				err = os.NewSyscallError("read", e)
				return true
			case n == 0:
				err = s.eof()
				return true
			}
			s.in = s.in[:len(s.in)+n]
			if err = s.drain(handle); err != nil {
				return true
			}
			// A short read took all the socket had: park, in this call (see Serve).
			// A full read: more may wait; return and read again in a new call.
			return n == free
		}
	}
	for {
		if rerr := rc.Read(read); err != nil || rerr != nil {
			if err != nil {
				return err
			}
			return rerr // the connection was closed (Close) or the poller failed
		}
	}
}

// serveStream is Serve's loop on a stream that is not a socket (tests, fuzzing).
func (s *Sub) serveStream(handle func([][]byte)) error {
	for {
		if len(s.in) == cap(s.in) {
			if err := s.growIn(); err != nil {
				return err
			}
		}
		n, err := s.src.Read(s.in[len(s.in):cap(s.in)])
		s.in = s.in[:len(s.in)+n]
		if derr := s.drain(handle); derr != nil {
			return derr
		}
		if err == io.EOF {
			return s.eof()
		}
		if err != nil {
			return err
		}
	}
}

// eof is the error for the end of the stream: io.EOF between messages, truncation
// inside one.
func (s *Sub) eof() error {
	if len(s.in) > 0 {
		return readErr(io.ErrUnexpectedEOF)
	}
	return io.EOF
}

// growIn doubles the buffer, which then holds one partial message from in[0] (drain
// moved it there), within the message size limit.
func (s *Sub) growIn() error {
	if len(s.in) >= s.maxMsg+serveSlack {
		return fmt.Errorf("%w: a message of over %d octets on the wire (limit %d)", ErrTooLarge, len(s.in), s.maxMsg)
	}
	b := make([]byte, len(s.in), min(2*cap(s.in), s.maxMsg+serveSlack))
	copy(b, s.in)
	s.in = b
	return nil
}

// drain hands off every whole message in s.in, handles the commands between them, and
// moves what is left (the start of the next message) to the buffer's front.
func (s *Sub) drain(handle func([][]byte)) error {
	used, err := s.parse(s.in, handle)
	if used > 0 {
		s.in = s.in[:copy(s.in, s.in[used:])]
	}
	return err
}

// parse handles the whole messages and commands at the front of buf and returns the
// octets they took. Its checks and errors are Recv's, made as soon as a frame's header
// is in buf.
func (s *Sub) parse(buf []byte, handle func([][]byte)) (used int, err error) {
	for {
		s.frames = s.frames[:0]
		total := uint64(0) // the message's body octets
		q := used
		for {
			if q == len(buf) {
				return used, nil
			}
			flags := buf[q]
			if flags&flagReserved != 0 {
				return used, fmt.Errorf("%w: reserved flag bits set (flags %#02x)", ErrFrame, flags)
			}
			if len(buf)-q < 2 {
				return used, nil
			}
			size, hdr := uint64(buf[q+1]), 2
			if flags&flagLong != 0 {
				if len(buf)-q < 9 {
					return used, nil
				}
				size, hdr = binary.BigEndian.Uint64(buf[q+1:q+9]), 9
				if size > 1<<63-1 {
					return used, fmt.Errorf("%w: frame size %d is over 2^63-1", ErrFrame, size)
				}
			}
			if flags&flagCommand != 0 {
				if len(s.frames) > 0 {
					return used, fmt.Errorf("%w: command frame inside a multipart message", ErrFrame)
				}
				if flags&flagMore != 0 {
					return used, fmt.Errorf("%w: command frame with the MORE flag", ErrFrame)
				}
				if size > maxCommand {
					return used, fmt.Errorf("%w: command frame of %d octets (limit %d)", ErrTooLarge, size, maxCommand)
				}
			} else if size > uint64(s.maxMsg)-total {
				return used, fmt.Errorf("%w: %d octets with this frame (limit %d)", ErrTooLarge, total+size, s.maxMsg)
			}
			body := q + hdr
			if uint64(len(buf)-body) < size {
				return used, nil
			}
			end := body + int(size)
			q = end
			if flags&flagCommand != 0 {
				if err := s.command(buf[body:end:end]); err != nil {
					return used, err
				}
				used = q
				break
			}
			s.frames = append(s.frames, buf[body:end:end])
			total += size
			if flags&flagMore == 0 {
				handle(s.frames)
				used = q
				break
			}
		}
	}
}
