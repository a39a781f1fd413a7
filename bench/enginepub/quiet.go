package enginepub

import (
	"io"
	"log"
)

// quietLogger silences zmq4's own logging (it prints on every failed handshake).
func quietLogger() *log.Logger { return log.New(io.Discard, "", 0) }
