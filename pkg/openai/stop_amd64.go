//go:build amd64 && !purego

package openai

import "golang.org/x/sys/cpu"

// useAVX2 is a variable so tests can exercise the portable path too.
var useAVX2 = cpu.X86.HasAVX2

// indexStopAVX2 returns the index of the first quote, backslash or control
// character among the first len(b)&^31 bytes of b, or len(b)&^31 if there
// is none. Implemented in stop_amd64.s.
//
//go:noescape
func indexStopAVX2(b []byte) int

// stopMask64AVX2 returns a mask with bit k set when b[k] (k < 64) is a stop
// byte; len(b) must be at least 64. Implemented in stop_amd64.s.
//
//go:noescape
func stopMask64AVX2(b []byte) uint64
