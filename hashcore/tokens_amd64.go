//go:build amd64 && !purego

package hashcore

import "github.com/klauspost/cpuid/v2"

// cborTokensAVX512 writes 8*steps tokens (steps >= 1) from tokens as CBOR unsigned ints
// at dst and returns the number of bytes written; pickleTokensAVX512 does the same with
// the pickle int opcodes. Each writes up to 64 bytes past its last token.
//
//go:noescape
func cborTokensAVX512(dst *byte, tokens *uint32, steps int) int

//go:noescape
func pickleTokensAVX512(dst *byte, tokens *uint32, steps int) int

// haveTokensAVX512 reports whether the AVX-512 token encoders can run here.
var haveTokensAVX512 = cpuid.CPU.Supports(cpuid.AVX512F, cpuid.AVX512BW, cpuid.AVX512VBMI2, cpuid.POPCNT)
