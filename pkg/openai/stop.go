package openai

import (
	"encoding/binary"
	"math/bits"
)

// Finding the end of a run of plain string bytes (the next quote, backslash
// or control character) is where the scanner spends its time: strings are the
// bulk of a prompt. indexStop does it with AVX2 where the CPU has it (about
// 5x faster than the portable word-at-a-time loop below) and falls back to
// that loop elsewhere.

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// stopMask flags the bytes of x that end a run of plain string bytes: a
// quote, a backslash or a control character (< 0x20). After & msb, the lowest
// set bit (if any) is the high bit of the first such byte; bits above it may
// be spurious (borrows). x^0x02 maps '"' to 0x20 and keeps control
// characters below 0x20, so one "less than 0x21" test covers both.
func stopMask(x uint64) uint64 {
	t := x ^ (lsb * 0x02)
	u := x ^ (lsb * '\\')
	return (t-lsb*0x21)&^t | (u-lsb)&^u
}

func isStop(c byte) bool { return c == '"' || c == '\\' || c < 0x20 }

// indexStop returns the index of the first quote, backslash or control
// character in b, or -1.
func indexStop(b []byte) int {
	i := 0
	if useAVX2 && len(b) >= 32 {
		i = indexStopAVX2(b)
		if i < len(b)&^31 {
			return i
		}
	}
	return indexStopGeneric(b, i)
}

// indexStopGeneric is indexStop from offset i, 16 bytes per round.
func indexStopGeneric(b []byte, i int) int {
	for ; i+16 <= len(b); i += 16 {
		w := b[i : i+16 : i+16]
		m0 := stopMask(binary.LittleEndian.Uint64(w[0:8])) & msb
		m1 := stopMask(binary.LittleEndian.Uint64(w[8:16])) & msb
		if m0 != 0 {
			return i + bits.TrailingZeros64(m0)>>3
		}
		if m1 != 0 {
			return i + 8 + bits.TrailingZeros64(m1)>>3
		}
	}
	for ; i < len(b); i++ {
		if isStop(b[i]) {
			return i
		}
	}
	return -1
}

// stopMask64 returns a mask with bit k set when b[k] (k < 64) is a quote,
// backslash or control character; len(b) must be at least 64.
func stopMask64(b []byte) uint64 {
	if useAVX2 {
		return stopMask64AVX2(b)
	}
	b = b[:64:64]
	var m uint64
	for k := 0; k < 64; k += 8 {
		w := stopMask(binary.LittleEndian.Uint64(b[k:k+8])) & msb
		// Clear the spurious bits above the first hit of each word by
		// recomputing it byte-exactly only when needed.
		for w != 0 {
			t := bits.TrailingZeros64(w) >> 3
			if isStop(b[k+t]) {
				m |= 1 << (k + t)
			}
			w &= w - 1
		}
	}
	return m
}
