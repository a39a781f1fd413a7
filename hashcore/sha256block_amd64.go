//go:build amd64 && !purego

package hashcore

import "github.com/klauspost/cpuid/v2"

// sha256Blocks runs the SHA-256 compression function over every 64-byte block of p
// (len(p) a multiple of 64; a partial tail is ignored), updating h. It needs the SHA
// extensions, SSSE3 and SSE4.1: call it only when haveSHA256Blocks.
//
//go:noescape
func sha256Blocks(h *[8]uint32, p []byte)

// haveSHA256Blocks reports whether sha256Blocks can run on this CPU.
var haveSHA256Blocks = cpuid.CPU.Supports(cpuid.SHA, cpuid.SSSE3, cpuid.SSE4)
