//go:build !linux

package shard

func adviseHuge([]bucket) {}
