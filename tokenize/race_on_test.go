//go:build race

package tokenize

// raceEnabled: the race detector is on; sync.Pool then drops items on purpose, so pooled
// scratch is reallocated now and then.
const raceEnabled = true
