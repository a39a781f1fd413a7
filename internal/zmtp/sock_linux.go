//go:build linux

package zmtp

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// sockReader reads a socket the way net.Conn.Read does (read until EAGAIN, then park
// on the poller; a read of 0 is the peer's close) but issues read(2) as a raw system
// call from inside the socket's RawConn.Read. Why: a read through net.Conn enters and
// leaves the scheduler's syscall state, and on a host where kvgate's Ps are busy the
// runtime's monitor keeps waking every 20 us to take a P back from a read that spans
// two of its ticks (a loopback read runs the TCP ACK it sends through the peer's
// receive path, tens of microseconds on a loaded VM), handing it to another thread and
// parking that thread again when the read returns. A read on a non-blocking socket
// never blocks, so nothing needs the P back: 1,024 engines' subscribers made that
// hand-off dance once per event batch.
type sockReader struct {
	rc syscall.RawConn
	// The current Read's buffer and result; read is r.readFD bound once (a method
	// value made per Read would allocate).
	p    []byte
	n    int
	err  error
	read func(fd uintptr) bool
}

// socketSource is what a Sub's buffered reader reads from: c itself, or a sockReader
// on c's descriptor when c has one.
func socketSource(c net.Conn) io.Reader {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	r := &sockReader{rc: rc}
	r.read = r.readFD
	return r
}

func (r *sockReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r.p, r.n, r.err = p, 0, nil
	err := r.rc.Read(r.read) // the connection closed, a deadline passed, or nil
	r.p = nil
	if err != nil {
		return 0, err
	}
	return r.n, r.err
}

// readFD is one read(2) of the socket into r.p: true when it has a result (octets, the
// end of the stream or an error), false when the socket is empty (EAGAIN): RawConn.Read
// then parks until the poller reports it readable, and calls readFD again.
func (r *sockReader) readFD(fd uintptr) bool {
	for {
		n, _, errno := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(r.p))), uintptr(len(r.p)))
		switch errno {
		case 0:
			if n == 0 {
				r.err = io.EOF
			}
			r.n = int(n)
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		default:
			r.err = os.NewSyscallError("read", errno)
			return true
		}
	}
}

// sockWriter writes a socket the way net.Conn.Write does (write until all is sent,
// parking on the poller while the socket is full; a write deadline set on the
// connection still bounds the wait) with send(2) issued as a raw system call from inside
// the socket's RawConn.Write, for sockReader's reason: the fleet's load generator
// writes 31k event batches a second from a few goroutines on the cores kvgate needs.
// MSG_NOSIGNAL: a peer gone is an EPIPE error, not a signal.
type sockWriter struct {
	rc    syscall.RawConn
	p     []byte // what is left to write of the current Write's buffer
	err   error
	write func(fd uintptr) bool
}

// socketSink is what Pub writes a peer's messages to: c itself, or a sockWriter on c's
// descriptor when c has one.
func socketSink(c net.Conn) io.Writer {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	w := &sockWriter{rc: rc}
	w.write = w.writeFD
	return w
}

func (w *sockWriter) Write(p []byte) (int, error) {
	w.p, w.err = p, nil
	err := w.rc.Write(w.write) // the connection closed, a deadline passed, or nil
	n := len(p) - len(w.p)
	w.p = nil
	if err != nil {
		return n, err
	}
	return n, w.err
}

// writeFD sends what is left of w.p: true when all is sent or on an error, false when
// the socket is full (EAGAIN): RawConn.Write then parks until it is writable.
func (w *sockWriter) writeFD(fd uintptr) bool {
	for len(w.p) > 0 {
		n, _, errno := syscall.RawSyscall6(syscall.SYS_SENDTO, fd, uintptr(unsafe.Pointer(unsafe.SliceData(w.p))), uintptr(len(w.p)), syscall.MSG_NOSIGNAL, 0, 0)
		switch errno {
		case 0:
			w.p = w.p[n:]
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			w.err = os.NewSyscallError("sendto", errno)
			return true
		}
	}
	return true
}
