//go:build race

package zmtp

// raceEnabled: the race detector is on; its instrumentation allocates now and then, so
// the allocation tests that compare counts skip.
const raceEnabled = true
