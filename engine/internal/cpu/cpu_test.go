package cpu

import "testing"

// Each feature implies the ones above it, and each Disable turns off what it names and
// everything above, and its undo brings back exactly what was there.
func TestFeaturesNestAndDisableUndoes(t *testing.T) {
	implied := func(f Features) bool {
		return (!f.AMXBF16 || f.AVX512BF16) && (!f.AVX512BF16 || f.AVX512) && (!f.AVX512 || f.AVX2)
	}
	if !implied(X86) {
		t.Fatalf("features do not nest: %+v", X86)
	}
	orig := X86
	for _, c := range []struct {
		name    string
		disable func() func()
		off     func(Features) bool
	}{
		{"AMX", DisableAMX, func(f Features) bool { return !f.AMXBF16 }},
		{"AVX512BF16", DisableAVX512BF16, func(f Features) bool { return !f.AVX512BF16 && !f.AMXBF16 }},
		{"AVX512", DisableAVX512, func(f Features) bool { return !f.AVX512 && !f.AVX512BF16 && !f.AMXBF16 }},
		{"AVX2", DisableAVX2, func(f Features) bool { return X86 == Features{} }},
	} {
		undo := c.disable()
		if !c.off(X86) || !implied(X86) {
			t.Errorf("Disable%s left %+v", c.name, X86)
		}
		if c.name != "AVX2" && X86.AVX2 != orig.AVX2 {
			t.Errorf("Disable%s changed AVX2", c.name)
		}
		undo()
		if X86 != orig {
			t.Fatalf("undo of Disable%s left %+v, want %+v", c.name, X86, orig)
		}
	}
	t.Logf("this CPU: %+v", orig)
}
