// Package freeport picks loopback TCP ports for servers that something else binds later
// (a child process, a ZeroMQ socket): the port is free when picked, not reserved.
//
// Ports come from below the kernel's ephemeral range (net.ipv4.ip_local_port_range,
// 32768-60999 by default), at random. A port the kernel handed out for ":0" and that was
// closed again is the next candidate for any outgoing connection's source port, so under
// parallel tests a child binding it a moment later can find it taken ("address already in
// use"); ports below the range are never handed out that way.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
)

// Span of the ports tried: above the well-known and the usual service ports, below the
// ephemeral range.
const lo, hi = 20000, 32768

// Pick returns a port p on 127.0.0.1 such that p .. p+n-1 could all be listened on just
// now (n >= 1; data-parallel ranks listen on base+r). After 100 random tries it falls back
// to a port the kernel picks (n = 1 only).
func Pick(n int) (int, error) {
	if n < 1 || n > 64 {
		return 0, fmt.Errorf("freeport: %d consecutive ports: want 1-64", n)
	}
	for try := 0; try < 100; try++ {
		p := lo + rand.IntN(hi-lo-n)
		if free(p, n) {
			return p, nil
		}
	}
	if n > 1 {
		return 0, fmt.Errorf("freeport: no %d consecutive free ports in %d-%d", n, lo, hi)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Addr is Pick(1) as "127.0.0.1:port".
func Addr() (string, error) {
	p, err := Pick(1)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("127.0.0.1:%d", p), nil
}

func free(p, n int) bool {
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for r := 0; r < n; r++ {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+r))
		if err != nil {
			return false
		}
		ls = append(ls, l)
	}
	return true
}
