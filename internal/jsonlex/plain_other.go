//go:build !amd64 || purego

package jsonlex

// usePlainAVX2: no vector plain-run search on this build.
var usePlainAVX2 = false

// plainEnd returns the index of the first byte of s that is not plain ASCII string
// content (the quote, the backslash, a control byte or a byte from 0x80), len(s) if none.
func plainEnd(s []byte) int { return plainEndSWAR(s) }
