package plane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// The wire format of one plane message: a fixed 32-byte little-endian header and the
// block keys, 8 bytes each, little-endian. No reflection, no varints: a consumer checks
// the length once and reads the keys in place.
//
//	[0]     magic 'K'
//	[1]     version (1)
//	[2]     op: 1 store, 2 remove, 3 clear, 4 snapshot
//	[3]     key kind: 0 the engine's keys (the rule's contract), 1 kvgate's fast keys
//	[4:8]   number of keys in this message
//	[8:16]  epoch: the publishing ingest replica's random id for its process lifetime
//	[16:24] seq: the endpoint's op counter within the epoch (a snapshot: the last op it covers)
//	[24:28] snapshot chunk index (0 otherwise)
//	[28:32] snapshot chunk count (0 otherwise)
//	[32:]   keys
const (
	headerLen  = 32
	wireMagic  = 'K'
	wireVer    = 1
	maxChunkOf = 1 << 20 // a sanity bound on chunk counts (2^20 chunks of 32Ki keys)
)

// Op is what a message does to an endpoint's inventory.
type Op uint8

const (
	OpStore    Op = 1 // add the keys
	OpRemove   Op = 2 // remove the keys
	OpClear    Op = 3 // drop every key of the endpoint
	OpSnapshot Op = 4 // one chunk of the endpoint's whole key set, which the chunks together replace
)

func (o Op) String() string {
	switch o {
	case OpStore:
		return "store"
	case OpRemove:
		return "remove"
	case OpClear:
		return "clear"
	case OpSnapshot:
		return "snapshot"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Key kinds.
const (
	kindEngine uint8 = 0
	kindFast   uint8 = 1
)

// header is a decoded message header.
type header struct {
	op     Op
	kind   uint8
	n      uint32
	epoch  uint64
	seq    uint64
	chunk  uint32
	chunks uint32
}

var errShort = errors.New("plane: message shorter than its header")

// appendMsg appends a message with header h (h.n is set from keys) to dst.
func appendMsg(dst []byte, h header, keys []uint64) []byte {
	var hb [headerLen]byte
	hb[0], hb[1], hb[2], hb[3] = wireMagic, wireVer, byte(h.op), h.kind
	binary.LittleEndian.PutUint32(hb[4:], uint32(len(keys)))
	binary.LittleEndian.PutUint64(hb[8:], h.epoch)
	binary.LittleEndian.PutUint64(hb[16:], h.seq)
	binary.LittleEndian.PutUint32(hb[24:], h.chunk)
	binary.LittleEndian.PutUint32(hb[28:], h.chunks)
	dst = append(dst, hb[:]...)
	for _, k := range keys {
		dst = binary.LittleEndian.AppendUint64(dst, k)
	}
	return dst
}

// parseHeader checks b and fills h; the keys are b[headerLen:], h.n of them.
func parseHeader(b []byte, h *header) error {
	if len(b) < headerLen {
		return errShort
	}
	if b[0] != wireMagic || b[1] != wireVer {
		return fmt.Errorf("plane: bad magic/version %#x %d (want 'K' %d)", b[0], b[1], wireVer)
	}
	h.op, h.kind = Op(b[2]), b[3]
	h.n = binary.LittleEndian.Uint32(b[4:])
	h.epoch = binary.LittleEndian.Uint64(b[8:])
	h.seq = binary.LittleEndian.Uint64(b[16:])
	h.chunk = binary.LittleEndian.Uint32(b[24:])
	h.chunks = binary.LittleEndian.Uint32(b[28:])
	if h.op < OpStore || h.op > OpSnapshot {
		return fmt.Errorf("plane: unknown op %d", b[2])
	}
	if h.kind > kindFast {
		return fmt.Errorf("plane: unknown key kind %d", h.kind)
	}
	if uint64(len(b)-headerLen) != 8*uint64(h.n) {
		return fmt.Errorf("plane: %s message says %d keys but carries %d bytes of keys", h.op, h.n, len(b)-headerLen)
	}
	if h.op == OpSnapshot && (h.chunks == 0 || h.chunks > maxChunkOf || h.chunk >= h.chunks) {
		return fmt.Errorf("plane: snapshot chunk %d of %d", h.chunk, h.chunks)
	}
	return nil
}

// appendKeys appends the keys of a checked message body to dst.
func appendKeys(dst []uint64, b []byte) []uint64 {
	for b = b[headerLen:]; len(b) >= 8; b = b[8:] {
		dst = append(dst, binary.LittleEndian.Uint64(b))
	}
	return dst
}

// Subjects. Every endpoint has three stream subjects under the prefix, so one filter
// (<prefix>.<endpoint>.*) follows it in order, and a core-NATS request subject outside the
// stream (<prefix>_req.<endpoint>) on which route replicas ask for a fresh snapshot.
const (
	subjEvents   = "ev"    // store / remove / clear
	subjSnapHead = "snap"  // a snapshot's first chunk: its stream seq is where a warm start begins
	subjSnapCont = "snapc" // its later chunks
)

// subjectToken makes an endpoint name one NATS subject token: letters, digits, '-' and '_'
// stay; every other byte (dots, wildcards, spaces) becomes %XX, so distinct names stay
// distinct tokens.
func subjectToken(name string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		}
	}
	return b.String()
}

// subjects is one endpoint's subject set.
type subjects struct {
	events, head, cont, filter, req string
}

func subjectsFor(prefix, name string) subjects {
	t := subjectToken(name)
	base := prefix + "." + t + "."
	return subjects{events: base + subjEvents, head: base + subjSnapHead, cont: base + subjSnapCont,
		filter: base + "*", req: prefix + "_req." + t}
}
