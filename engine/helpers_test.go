package engine

import (
	"os"
	"testing"
)

func mkdirTemp() (string, error) { return os.MkdirTemp("", "skein-engine-test-") }

// adapterWithB creates an adapter and sets its B matrices, zero at PEFT init (which makes every
// gradient of A zero), to f(parameter index, element), rounded to the engine's dtype.
func adapterWithB(t testing.TB, e *Engine, id string, cfg LoraConfig, f func(i, j int) float64) *Adapter {
	t.Helper()
	a, err := e.CreateAdapter(id, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range a.params {
		if i%2 == 1 {
			w := make([]float64, p.size())
			for j := range w {
				w[j] = f(i, j)
			}
			p.setFloat64s('w', w) // narrowed to the engine's dtype
		}
	}
	return a
}

// hostNumbers are a param's numbers on the host, for tests that read or change them in place.
type hostNumbers[E float] struct{ w, g, m, v []E }

func hostState[E float](s *paramState[E]) *hostNumbers[E] {
	if s == nil {
		return nil
	}
	return &hostNumbers[E]{w: hostOf(s.w), g: hostOf(s.g), m: hostOf(s.m), v: hostOf(s.v)}
}
