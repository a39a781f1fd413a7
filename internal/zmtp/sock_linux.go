//go:build linux

package zmtp

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// rawSock reads and writes a socket the way net.Conn does (read until EAGAIN, then park
// on the poller, a read of 0 being the peer's close; write until all is sent, parking
// while the socket is full; the connection's deadlines still bound the waits) but
// issues read(2) and send(2) as raw system calls from inside the socket's RawConn.Read
// and RawConn.Write. Why: a call through net.Conn enters and leaves the scheduler's
// syscall state, and on a host where the Ps are busy the runtime's monitor keeps waking
// every 20 us to take a P back from a call that spans two of its ticks (a loopback read
// sends the TCP ACK through the peer's receive path, a write delivers into the peer's
// socket: tens of microseconds on a loaded VM), handing it to another thread and parking
// that thread again when the call returns. A call on a non-blocking socket never
// blocks, so nothing needs the P back. 1,024 engines' subscribers made that hand-off
// dance once per event batch, and the fleet's load generator once per write.
// MSG_NOSIGNAL: a peer gone is an EPIPE error, not a signal.
type rawSock struct {
	rc syscall.RawConn
	// The current call's buffer (Write: what is left of it) and result; read and write
	// are readFD and writeFD bound once (a method value made per call would allocate).
	p           []byte
	n           int
	err         error
	read, write func(fd uintptr) bool
}

// newRawSock is c's rawSock, or false when c has no descriptor.
func newRawSock(c net.Conn) (*rawSock, bool) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, false
	}
	s := &rawSock{rc: rc}
	s.read, s.write = s.readFD, s.writeFD
	return s, true
}

// socketSource is what a Sub's buffered reader reads from: a rawSock on c, or c.
func socketSource(c net.Conn) io.Reader {
	if s, ok := newRawSock(c); ok {
		return s
	}
	return c
}

// socketSink is what Pub writes a peer's messages to: a rawSock on c, or c.
func socketSink(c net.Conn) io.Writer {
	if s, ok := newRawSock(c); ok {
		return s
	}
	return c
}

// Read is one read's worth of octets, as net.Conn.Read. Not for concurrent use (Sub
// reads from one goroutine).
func (s *rawSock) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.p, s.n, s.err = p, 0, nil
	err := s.rc.Read(s.read) // the connection closed, a deadline passed, or nil
	s.p = nil
	if err != nil {
		return 0, err
	}
	return s.n, s.err
}

// readFD is one read(2) of the socket into s.p: true when it has a result (octets, the
// end of the stream or an error), false when the socket is empty (EAGAIN): RawConn.Read
// then parks until the poller reports it readable, and calls readFD again.
func (s *rawSock) readFD(fd uintptr) bool {
	for {
		n, _, errno := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(s.p))), uintptr(len(s.p)))
		switch errno {
		case 0:
			if n == 0 {
				s.err = io.EOF
			}
			s.n = int(n)
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		default:
			s.err = os.NewSyscallError("read", errno)
			return true
		}
	}
}

// Write sends all of p, as net.Conn.Write. Not for concurrent use (Pub serializes a
// peer's writes).
func (s *rawSock) Write(p []byte) (int, error) {
	s.p, s.err = p, nil
	err := s.rc.Write(s.write) // the connection closed, a deadline passed, or nil
	n := len(p) - len(s.p)
	s.p = nil
	if err != nil {
		return n, err
	}
	return n, s.err
}

// writeFD sends what is left of s.p: true when all is sent or on an error, false when
// the socket is full (EAGAIN): RawConn.Write then parks until it is writable.
func (s *rawSock) writeFD(fd uintptr) bool {
	for len(s.p) > 0 {
		n, _, errno := syscall.RawSyscall6(syscall.SYS_SENDTO, fd, uintptr(unsafe.Pointer(unsafe.SliceData(s.p))), uintptr(len(s.p)), syscall.MSG_NOSIGNAL, 0, 0)
		switch errno {
		case 0:
			s.p = s.p[n:]
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			s.err = os.NewSyscallError("sendto", errno)
			return true
		}
	}
	return true
}
