//go:build amd64 && !purego

#include "textflag.h"

DATA stopc<>+0(SB)/1, $0x22
DATA stopc<>+1(SB)/1, $0x5c
DATA stopc<>+2(SB)/1, $0x1f
GLOBL stopc<>(SB), RODATA|NOPTR, $8

// func indexStopAVX2(b []byte) int
//
// Scans 64 (then 32) bytes per round for '"' (0x22), '\\' (0x5c) or a byte
// <= 0x1f, and returns the index of the first one, or len(b)&^31.
// It reads only whole 32-byte blocks inside b.
TEXT ·indexStopAVX2(SB), NOSPLIT, $0-32
	MOVQ b_base+0(FP), SI
	MOVQ b_len+8(FP), CX
	ANDQ $~31, CX
	XORQ AX, AX

	// Broadcast from memory: a legacy-SSE MOVQ into X1 here costs ~200ns
	// per call on some (virtualized) CPUs.
	VPBROADCASTB stopc<>+0(SB), Y1
	VPBROADCASTB stopc<>+1(SB), Y2
	VPBROADCASTB stopc<>+2(SB), Y3

loop64:
	LEAQ 64(AX), DI
	CMPQ DI, CX
	JA   loop32
	VMOVDQU (SI)(AX*1), Y0
	VMOVDQU 32(SI)(AX*1), Y7
	VPCMPEQB Y1, Y0, Y4
	VPCMPEQB Y2, Y0, Y5
	VPMINUB  Y3, Y0, Y6
	VPCMPEQB Y6, Y0, Y6
	VPOR     Y5, Y4, Y4
	VPOR     Y6, Y4, Y4
	VPCMPEQB Y1, Y7, Y8
	VPCMPEQB Y2, Y7, Y9
	VPMINUB  Y3, Y7, Y10
	VPCMPEQB Y10, Y7, Y10
	VPOR     Y9, Y8, Y8
	VPOR     Y10, Y8, Y8
	VPOR     Y8, Y4, Y9
	VPTEST   Y9, Y9
	JNZ      hit64
	MOVQ     DI, AX
	JMP      loop64

hit64:
	VPMOVMSKB Y4, DX
	TESTL     DX, DX
	JNZ       found
	VPMOVMSKB Y8, DX
	ADDQ      $32, AX
	JMP       found

loop32:
	CMPQ AX, CX
	JAE  none
	VMOVDQU (SI)(AX*1), Y0
	VPCMPEQB Y1, Y0, Y4
	VPCMPEQB Y2, Y0, Y5
	VPMINUB  Y3, Y0, Y6
	VPCMPEQB Y6, Y0, Y6
	VPOR     Y5, Y4, Y4
	VPOR     Y6, Y4, Y4
	VPMOVMSKB Y4, DX
	TESTL    DX, DX
	JNZ      found
	ADDQ     $32, AX
	JMP      loop32

found:
	BSFL DX, DX
	ADDQ DX, AX

none:
	VZEROUPPER
	MOVQ AX, ret+24(FP)
	RET

// func stopMask64AVX2(b []byte) uint64
//
// Returns a mask with bit k set when b[k] (k < 64) is '"', '\\' or <= 0x1f.
// The caller guarantees len(b) >= 64.
TEXT ·stopMask64AVX2(SB), NOSPLIT, $0-32
	MOVQ b_base+0(FP), SI
	VPBROADCASTB stopc<>+0(SB), Y1
	VPBROADCASTB stopc<>+1(SB), Y2
	VPBROADCASTB stopc<>+2(SB), Y3
	VMOVDQU (SI), Y0
	VMOVDQU 32(SI), Y7
	VPCMPEQB Y1, Y0, Y4
	VPCMPEQB Y2, Y0, Y5
	VPMINUB  Y3, Y0, Y6
	VPCMPEQB Y6, Y0, Y6
	VPOR     Y5, Y4, Y4
	VPOR     Y6, Y4, Y4
	VPCMPEQB Y1, Y7, Y8
	VPCMPEQB Y2, Y7, Y9
	VPMINUB  Y3, Y7, Y10
	VPCMPEQB Y10, Y7, Y10
	VPOR     Y9, Y8, Y8
	VPOR     Y10, Y8, Y8
	VPMOVMSKB Y4, AX
	VPMOVMSKB Y8, DX
	SHLQ $32, DX
	ORQ  DX, AX
	VZEROUPPER
	MOVQ AX, ret+24(FP)
	RET
