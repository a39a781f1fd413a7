//go:build !unix

package ingest

func processCPU() int64 { return 0 }
