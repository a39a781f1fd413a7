//go:build !linux

package zmtp

import (
	"io"
	"net"
)

// socketSource is what a Sub's buffered reader reads from: the connection itself (the
// raw reads of sockread_linux.go are Linux's).
func socketSource(c net.Conn) io.Reader { return c }

// socketSink is what Pub writes a peer's messages to: the connection itself.
func socketSink(c net.Conn) io.Writer { return c }
