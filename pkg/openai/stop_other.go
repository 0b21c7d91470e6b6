//go:build !amd64 || purego

package openai

var useAVX2 = false

func indexStopAVX2(b []byte) int { return 0 }

func stopMask64AVX2(b []byte) uint64 { return 0 }
