//go:build race

package engine

// raceEnabled: the race detector slows the engine about 30 times.
const raceEnabled = true
