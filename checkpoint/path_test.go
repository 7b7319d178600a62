package checkpoint

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	good := map[string]Path{
		"tinker://s:train:0/weights/step-1":         {ModelID: "s:train:0", Kind: KindWeights, Name: "step-1"},
		"twinkle://s:train:3/sampler_weights/a.b_c": {ModelID: "s:train:3", Kind: KindSamplerWeights, Name: "a.b_c"},
	}
	for in, want := range good {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		if strings.HasPrefix(in, "tinker://") && got.String() != in {
			t.Errorf("String() = %q, want %q", got.String(), in)
		}
	}
	for _, bad := range []string{"", "s:train:0/weights/x", "tinker://s/weights", "tinker://s/weights/x/y",
		"tinker://s/other/x", "tinker://s/weights/..", "tinker://s/weights/../../etc", "tinker://../weights/x",
		"tinker:///weights/x", "tinker://s/weights/" + strings.Repeat("a", 200), "tinker://s/weights/.hidden"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

func TestDirStaysUnderRoot(t *testing.T) {
	p, _ := Parse("tinker://sess-1:train:0/weights/w1")
	dir := p.Dir("/data")
	if !strings.HasPrefix(dir, filepath.Join("/data", "checkpoints")+"/") || strings.Contains(dir, ":") {
		t.Fatalf("Dir = %q", dir)
	}
}
