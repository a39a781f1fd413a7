package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestPickIsBelowTheEphemeralRangeAndFree(t *testing.T) {
	for _, n := range []int{1, 2, 8} {
		p, err := Pick(n)
		if err != nil {
			t.Fatal(err)
		}
		if p < lo || p+n > hi {
			t.Fatalf("Pick(%d) = %d: outside %d-%d", n, p, lo, hi)
		}
		for r := 0; r < n; r++ {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+r)))
			if err != nil {
				t.Fatalf("Pick(%d) = %d: port %d not free: %v", n, p, p+r, err)
			}
			l.Close()
		}
	}
}

func TestPickSkipsATakenPort(t *testing.T) {
	// Hold every port but one of a small window: free must refuse the held ones.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p := l.Addr().(*net.TCPAddr).Port
	if free(p, 1) {
		t.Fatalf("port %d is held but free() says free", p)
	}
	if free(p-1, 2) {
		t.Fatalf("ports %d-%d include a held one but free() says free", p-1, p)
	}
}

func TestPickRefusesBadCounts(t *testing.T) {
	for _, n := range []int{0, -1, 65} {
		if _, err := Pick(n); err == nil {
			t.Fatalf("Pick(%d): no error", n)
		}
	}
}
