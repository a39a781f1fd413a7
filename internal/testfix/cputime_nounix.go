//go:build !unix

package testfix

// ProcessCPU is the CPU time this process has used: not read on this platform (0).
func ProcessCPU() int64 { return 0 }
