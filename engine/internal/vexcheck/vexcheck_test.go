package vexcheck

import (
	"slices"
	"testing"
)

// The dataflow flags legacy SSE and exits that some path reaches with dirty upper halves, and
// only those: straight code, a VZEROUPPER, a loop's back edge, and a panic path.
func TestDirtyPaths(t *testing.T) {
	prog := func(lines ...string) []asmInsn {
		var in []asmInsn
		for i, l := range lines {
			in = append(in, asmInsn{offset: 10 * i, loc: "f.go", text: l})
		}
		return in
	}
	texts := func(in []asmInsn) []string {
		var s []string
		for _, i := range in {
			s = append(s, i.text)
		}
		return s
	}
	for _, c := range []struct {
		name        string
		code        []asmInsn
		sse, leaves []string
	}{
		{"clean", prog("MOVSS X0, X1", "VADDPS Y0, Y1, Y2", "VZEROUPPER", "ADDSS X1, X0", "RET"), nil, nil},
		{"sse after a vector", prog("VADDPS Y0, Y1, Y2", "ADDSS X1, X0", "VZEROUPPER", "RET"), []string{"ADDSS X1, X0"}, nil},
		{"return dirty", prog("VADDPS Y0, Y1, Y2", "RET"), nil, []string{"RET"}},
		// A panic ends its path: what follows it is reached only by the jump's other side.
		{"a call dirty, a panic not", prog("VADDPS Y0, Y1, Y2", "JEQ 30", "CALL f(SB)", "CALL runtime.panicBounds(SB)", "VZEROUPPER", "RET"),
			nil, []string{"CALL f(SB)"}},
		// offsets: 0 MOVQ, 10 VPSRLD, 20 JLT 0, 30 VZEROUPPER, 40 RET: the move runs dirty on the
		// loop's second pass only.
		{"loop back edge", prog("MOVQ SI, X6", "VPSRLD X6, Y4, Y4", "JLT 0", "VZEROUPPER", "RET"), []string{"MOVQ SI, X6"}, nil},
		{"jump over the clear", prog("VADDPS Y0, Y1, Y2", "JEQ 30", "VZEROUPPER", "MULSS X0, X1", "RET"),
			[]string{"MULSS X0, X1"}, []string{"RET"}},
	} {
		if got := texts(sseWhileDirty(c.code)); !slices.Equal(got, c.sse) {
			t.Errorf("%s: legacy SSE flagged %q, want %q", c.name, got, c.sse)
		}
		if got := texts(leavesDirty(c.code)); !slices.Equal(got, c.leaves) {
			t.Errorf("%s: exits flagged %q, want %q", c.name, got, c.leaves)
		}
	}
}
