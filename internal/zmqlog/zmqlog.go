// Package zmqlog holds the logger kvgate gives every zmq4 socket it opens, the
// subscribers' (ingest) and the test and simulator publishers' (bench/enginepub).
package zmqlog

import (
	"io"
	"log"
)

// Discard drops zmq4's own log lines: it prints one through the standard logger on every
// failed handshake, which a subscriber redialling a down engine would repeat each retry.
// kvgate reports connection state itself (WARN on transitions, /debug/inventory).
var Discard = log.New(io.Discard, "", 0)
