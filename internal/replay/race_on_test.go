//go:build race

package replay

// raceEnabled: tests build the picker with -race too, reusing the race-built dependencies.
const raceEnabled = true
