package shard

import "math/bits"

// MaxEndpoints is the widest mask a rule may have. Masks up to 64 endpoints live inline
// in the index (the fast path); wider rules keep sparse endpoint sets (sparse.go), whose
// 16-bit ids also bound it.
const MaxEndpoints = 1024

// maxWords is MaxEndpoints in 64-bit words: the size of the stack scratch Score uses
// for wide rules, so it never allocates.
const maxWords = MaxEndpoints / 64

// Mask is an endpoint bitset: bit i%64 of word i/64 stands for endpoint index i.
// Out-of-range indexes are ignored by Set, Clear and Has, so a bad index from a caller
// can never panic the request path.
type Mask []uint64

// NewMask returns an all-clear mask wide enough for endpoints indexes [0, endpoints).
func NewMask(endpoints int) Mask {
	if endpoints < 1 {
		endpoints = 1
	}
	return make(Mask, (endpoints+63)/64)
}

// Set sets endpoint i.
func (m Mask) Set(i int) {
	if i >= 0 && i>>6 < len(m) {
		m[i>>6] |= 1 << (uint(i) & 63)
	}
}

// Clear clears endpoint i.
func (m Mask) Clear(i int) {
	if i >= 0 && i>>6 < len(m) {
		m[i>>6] &^= 1 << (uint(i) & 63)
	}
}

// Has reports whether endpoint i is set.
func (m Mask) Has(i int) bool {
	return i >= 0 && i>>6 < len(m) && m[i>>6]&(1<<(uint(i)&63)) != 0
}

// SetAll sets endpoints [0, n) and clears every other bit, as far as the mask reaches.
func (m Mask) SetAll(n int) {
	for w := range m {
		switch lo := w * 64; {
		case n >= lo+64:
			m[w] = ^uint64(0)
		case n > lo:
			m[w] = lowBits(n - lo)
		default:
			m[w] = 0
		}
	}
}

// Count is the number of endpoints set.
func (m Mask) Count() int {
	n := 0
	for _, w := range m {
		n += bits.OnesCount64(w)
	}
	return n
}

// And sets m to a AND b, as far as all three reach (m's words past them clear), and
// returns how many endpoints m holds: a whole word at a time, where testing each index
// would cost a branch per endpoint.
func (m Mask) And(a, b Mask) int {
	n := 0
	for w := range m {
		var x uint64
		if w < len(a) && w < len(b) {
			x = a[w] & b[w]
		}
		m[w] = x
		n += bits.OnesCount64(x)
	}
	return n
}

// lowBits returns a word with the low n bits set, 0 <= n <= 64.
func lowBits(n int) uint64 {
	if n >= 64 {
		return ^uint64(0)
	}
	return 1<<uint(n) - 1
}

// Mode selects what Score counts per endpoint.
type Mode uint8

const (
	// Overlap counts the prompt's keys an endpoint holds, wherever they sit in the chain
	// (the seed contract's definition).
	Overlap Mode = iota
	// Prefix counts the leading run of the prompt's keys an endpoint holds: the blocks
	// an engine can actually reuse, since its prefix cache matches from block 0.
	Prefix
)

// String returns the mode as flags spell it.
func (m Mode) String() string {
	switch m {
	case Overlap:
		return "overlap"
	case Prefix:
		return "prefix"
	}
	return "unknown"
}

// ParseMode maps a flag value ("overlap", "prefix") to a Mode.
func ParseMode(s string) (Mode, bool) {
	switch s {
	case "overlap":
		return Overlap, true
	case "prefix":
		return Prefix, true
	}
	return 0, false
}
