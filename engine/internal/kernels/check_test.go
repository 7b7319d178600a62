package kernels

import (
	"os"
	"strings"
	"testing"
)

// Every path this CPU has passes the start-up check, and init chose the best one.
func TestEveryPathPassesTheCheck(t *testing.T) {
	for _, p := range SupportedPaths() {
		if err := Check(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	want := Best()
	if p, err := ParsePath(os.Getenv("SKEIN_GEMM")); err == nil && Supported(p) {
		want = p
	}
	if len(StartFaults()) != 0 || Active() != want {
		t.Fatalf("init chose %s with faults %v; want %s", Active(), StartFaults(), want)
	}
}

// A path whose GEMM is wrong is passed over for the next slower one, and the fault is reported:
// here the AVX-512 GEMM is replaced by one that drops the last step of k.
func TestChooseFallsBackFromAWrongKernel(t *testing.T) {
	usePath(t, AVX512)
	saved := avx512Micro
	t.Cleanup(func() { avx512Micro = saved })
	right := avx512Micro.run
	avx512Micro.run = func(kc int, a *float32, lda int, b, c *float32, ldc int, first bool) {
		right(max(kc-1, 1), a, lda, b, c, ldc, first)
	}
	got, faults, err := Choose(AVX512)
	if err != nil {
		t.Fatal(err)
	}
	if got != AVX2 || len(faults) != 1 || !strings.Contains(faults[0].Error(), "avx512") {
		t.Fatalf("chose %s with faults %v, want avx2 and one fault naming avx512", got, faults)
	}
	if _, _, err := Choose(Path(99)); err == nil {
		t.Fatal("Choose accepted a path that does not exist")
	}
}
