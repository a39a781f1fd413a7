//go:build !unix

package shard

func processCPU() int64 { return 0 }
