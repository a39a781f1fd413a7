// Package zmtp speaks the subscriber side of ZMTP 3.x (the ZeroMQ Message Transport
// Protocol, rfc.zeromq.org 23/ZMTP for 3.0 and 37/ZMTP for 3.1) over TCP with the NULL
// security mechanism: what kvgate needs to follow an engine's KV-event PUB socket, and
// nothing else. One Sub is one connection, read by one goroutine through one buffered
// reader; a message's frames are read into buffers the Sub reuses, so a message costs no
// allocation once the buffers have grown to the stream's largest message.
//
// The wire facts this package relies on, with their sources, are in docs/CONTRACTS.md
// ("ZMTP subscriber").
package zmtp

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Greeting layout (37/ZMTP "Formal Grammar"): signature (0xFF, 8 padding octets, 0x7F),
// version major and minor, a 20-octet NUL-padded mechanism, as-server, 31 zero octets.
const (
	greetingSize = 64
	sigSize      = 10 // signature alone
	mechOffset   = 12
	mechSize     = 20
)

// Frame flags (37/ZMTP "Framing"): bits 7-3 are reserved and MUST be zero.
const (
	flagMore     = 0x01
	flagLong     = 0x02
	flagCommand  = 0x04
	flagReserved = 0xF8
)

// Errors a Sub returns. Each wraps ErrProtocol, which says the peer is not a ZMTP 3.x
// PUB speaking what this package reads (a misconfiguration, not a network blip).
var (
	ErrProtocol   = errors.New("zmtp: protocol error")
	ErrGreeting   = fmt.Errorf("%w: bad greeting", ErrProtocol)
	ErrVersion    = fmt.Errorf("%w: unsupported ZMTP version", ErrProtocol)
	ErrMechanism  = fmt.Errorf("%w: security mechanism is not NULL", ErrProtocol)
	ErrSocketType = fmt.Errorf("%w: peer socket type cannot publish to a SUB", ErrProtocol)
	ErrFrame      = fmt.Errorf("%w: malformed frame", ErrProtocol)
	ErrTooLarge   = fmt.Errorf("%w: message exceeds the size limit", ErrProtocol)
	ErrPeer       = fmt.Errorf("%w: peer sent ERROR", ErrProtocol)
)

// appendGreeting appends our 64-octet greeting: ZMTP 3.1, NULL, not as-server.
func appendGreeting(dst []byte) []byte {
	var g [greetingSize]byte
	g[0], g[9] = 0xFF, 0x7F
	g[10], g[11] = 3, 1
	copy(g[mechOffset:], "NULL")
	return append(dst, g[:]...)
}

// appendCommand appends one command frame: name, then body (37/ZMTP: command-body =
// command-name command-data; command-name is a short size and 1-255 ALPHA).
func appendCommand(dst []byte, name string, body ...[]byte) []byte {
	n := 1 + len(name)
	for _, b := range body {
		n += len(b)
	}
	dst = appendFrameHeader(dst, flagCommand, n)
	dst = append(dst, byte(len(name)))
	dst = append(dst, name...)
	for _, b := range body {
		dst = append(dst, b...)
	}
	return dst
}

// appendFrameHeader appends a frame's flags and size: short (one octet) up to 255,
// else long (eight octets, network order), as 37/ZMTP recommends.
func appendFrameHeader(dst []byte, flags byte, size int) []byte {
	if size <= 255 {
		return append(dst, flags, byte(size))
	}
	dst = append(dst, flags|flagLong)
	return binary.BigEndian.AppendUint64(dst, uint64(size))
}

// appendReady appends a READY command carrying one Socket-Type property (the NULL
// mechanism's metadata: a short-size name, a 4-octet network-order value size, value).
func appendReady(dst []byte, socketType string) []byte {
	const name = "Socket-Type"
	prop := make([]byte, 0, 1+len(name)+4+len(socketType))
	prop = append(prop, byte(len(name)))
	prop = append(prop, name...)
	prop = binary.BigEndian.AppendUint32(prop, uint32(len(socketType)))
	prop = append(prop, socketType...)
	return appendCommand(dst, "READY", prop)
}

// appendSubscribe appends a subscription to topic in the form the peer's version reads:
// the SUBSCRIBE command from ZMTP 3.1 on (37/ZMTP "The Publish-Subscribe Pattern"), a
// one-frame message whose first octet is 1 for 3.0 (23/ZMTP).
func appendSubscribe(dst []byte, topic string, major, minor byte) []byte {
	if major > 3 || minor >= 1 {
		return appendCommand(dst, "SUBSCRIBE", []byte(topic))
	}
	dst = appendFrameHeader(dst, 0, 1+len(topic))
	dst = append(dst, 1)
	return append(dst, topic...)
}

// parseCommand splits a command body into its name and data.
func parseCommand(body []byte) (name, data []byte, err error) {
	if len(body) < 1 || int(body[0]) == 0 || len(body) < 1+int(body[0]) {
		return nil, nil, fmt.Errorf("%w: command name overruns its frame", ErrFrame)
	}
	n := int(body[0])
	return body[1 : 1+n], body[1+n:], nil
}

// readyProperty finds property name (case-insensitive, as 37/ZMTP requires) in a READY
// command's data.
func readyProperty(data []byte, name string) (value []byte, found bool, err error) {
	for len(data) > 0 {
		nl := int(data[0])
		if nl == 0 || len(data) < 1+nl+4 {
			return nil, false, fmt.Errorf("%w: READY property overruns its command", ErrFrame)
		}
		pname := data[1 : 1+nl]
		vl := binary.BigEndian.Uint32(data[1+nl:])
		data = data[1+nl+4:]
		if uint64(vl) > uint64(len(data)) {
			return nil, false, fmt.Errorf("%w: READY property value overruns its command", ErrFrame)
		}
		if equalFold(pname, name) && !found {
			value, found = data[:vl], true
		}
		data = data[vl:]
	}
	return value, found, nil
}

func equalFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		x, y := b[i], s[i]
		if 'a' <= x && x <= 'z' {
			x -= 'a' - 'A'
		}
		if 'a' <= y && y <= 'z' {
			y -= 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
