//go:build !purego

package jsonlex

import "github.com/klauspost/cpuid/v2"

//go:noescape
func plainEndAVX2(s []byte) int

// usePlainAVX2 selects plainEndAVX2; tests turn it off to cover the portable plainEnd.
var usePlainAVX2 = cpuid.CPU.Supports(cpuid.AVX2)

// plainEnd returns the index of the first byte of s that is not plain ASCII string
// content (the quote, the backslash, a control byte or a byte from 0x80), len(s) if none.
func plainEnd(s []byte) int {
	if usePlainAVX2 {
		return plainEndAVX2(s)
	}
	return plainEndSWAR(s)
}
