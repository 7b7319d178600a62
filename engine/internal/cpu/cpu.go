// Package cpu is the one place that reads the CPU's features: the kernels choose their paths
// from X86, and tests turn features off with the Disable functions, each of which returns its
// undo (as klauspost/compress's internal/cpuinfo does).
package cpu

import xcpu "golang.org/x/sys/cpu"

// Features are what the kernels can use. Each implies the ones above it.
type Features struct {
	// AVX2 is AVX2 with FMA: the 8-lane kernels need both (every MulAdd is a VFMADD).
	AVX2 bool
	// AVX512 is AVX-512 F, BW, DQ and VL with the OS saving the zmm state (archsimd's AVX512).
	AVX512 bool
	// AVX512BF16 is VDPBF16PS and VCVTNE2PS2BF16.
	AVX512BF16 bool
	// AMXBF16 is AMX-TILE and AMX-BF16, and Linux granted this process the tile state.
	AMXBF16 bool
}

// X86 holds this CPU's features, read at init. Tests change it only through the Disable
// functions; nothing may change it while kernels run.
var X86 = detect()

func detect() Features {
	var f Features
	f.AVX2 = xcpu.X86.HasAVX2 && xcpu.X86.HasFMA && xcpu.X86.HasAVX
	f.AVX512 = f.AVX2 && xcpu.X86.HasAVX512F && xcpu.X86.HasAVX512BW && xcpu.X86.HasAVX512DQ && xcpu.X86.HasAVX512VL
	f.AVX512BF16 = f.AVX512 && xcpu.X86.HasAVX512BF16
	f.AMXBF16 = f.AVX512BF16 && xcpu.X86.HasAMXTile && xcpu.X86.HasAMXBF16 && requestTileState() == nil
	return f
}

// DisableAMX turns AMX off (tests), returning the undo.
func DisableAMX() (restore func()) { return set(func(f *Features) { f.AMXBF16 = false }) }

// DisableAVX512BF16 turns AVX512_BF16 and AMX off.
func DisableAVX512BF16() (restore func()) {
	return set(func(f *Features) { f.AVX512BF16, f.AMXBF16 = false, false })
}

// DisableAVX512 turns AVX-512 and everything above it off.
func DisableAVX512() (restore func()) {
	return set(func(f *Features) { f.AVX512, f.AVX512BF16, f.AMXBF16 = false, false, false })
}

// DisableAVX2 turns every vector feature off: the scalar paths.
func DisableAVX2() (restore func()) { return set(func(f *Features) { *f = Features{} }) }

func set(change func(*Features)) func() {
	old := X86
	change(&X86)
	return func() { X86 = old }
}
