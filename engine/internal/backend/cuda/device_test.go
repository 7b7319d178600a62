package cuda

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestOpenWithoutDevice: with the driver's library and no GPU (Debian's libcuda1 in CI),
// Devices and Open fail cleanly: an error naming CUDA_ERROR_NO_DEVICE (100) and the driver,
// errors.Is ErrNoDevice, no panic. Skipped without libcuda; on a machine with a GPU it logs
// the probe instead.
func TestOpenWithoutDevice(t *testing.T) {
	if _, err := findLib(libDriver, searchDirs(osEnv())); err != nil {
		t.Skipf("skipped: no CUDA driver library here (scripts/cuda-ci-libs.sh installs Debian's libcuda1): %v", err)
	}
	devs, err := Devices()
	if err == nil {
		for _, d := range devs {
			t.Logf("GPU: %v", d)
		}
		if _, err := Open(len(devs)); err == nil || !strings.Contains(err.Error(), "no device cuda:") {
			t.Errorf("Open past the last GPU: %v", err)
		}
		return
	}
	t.Logf("Devices: %v", err)
	dev, err2 := Open(0)
	if dev != nil || err2 == nil {
		t.Fatalf("Open(0) = %v, %v after Devices failed", dev, err2)
	}
	if errors.Is(err, ErrNoDevice) {
		for _, s := range []string{"no GPU", "CUDA_ERROR_NO_DEVICE", "(100)", "libcuda.so.1"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error lacks %q: %v", s, err)
			}
		}
		var ce *Error
		if !errors.As(err, &ce) || ce.Call != "cuInit" || ce.Code != 100 {
			t.Errorf("error is not cuInit's 100: %#v", ce)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error spans lines: %q", err)
	}
	// The same answer again: the driver is loaded and initialised once.
	if _, again := Devices(); again == nil || again.Error() != err.Error() {
		t.Errorf("second probe: %v, want %v", again, err)
	}
}

// TestParseDevice: the --device values.
func TestParseDevice(t *testing.T) {
	for _, c := range []struct {
		in      string
		kind    string
		ordinal int
		bad     bool
	}{
		{"", "auto", 0, false}, {"auto", "auto", 0, false}, {"AUTO", "auto", 0, false}, {"cpu", "cpu", 0, false},
		{"cuda", "cuda", 0, false}, {"cuda:0", "cuda", 0, false}, {"cuda:3", "cuda", 3, false},
		{"cuda:", "", 0, true}, {"cuda:-1", "", 0, true}, {"cuda:x", "", 0, true}, {"gpu", "", 0, true}, {"cuda0", "", 0, true},
	} {
		k, o, err := ParseDevice(c.in)
		if (err != nil) != c.bad || k != c.kind || o != c.ordinal {
			t.Errorf("ParseDevice(%q) = %q, %d, %v", c.in, k, o, err)
		}
	}
}

type fakeNVRTC struct{ archs []int }

func (f fakeNVRTC) Supports(a int) bool {
	for _, x := range f.archs {
		if x == a {
			return true
		}
	}
	return false
}
func (f fakeNVRTC) Version() string { return "12.4" }

// TestSelectDevice: auto takes the first working GPU, else the CPU with the reason; cpu never
// probes; cuda and cuda:N are that GPU or a clear error.
func TestSelectDevice(t *testing.T) {
	h100 := Info{Ordinal: 0, Name: "H100", Major: 9, Minor: 0}
	t4 := Info{Ordinal: 0, Name: "T4", Major: 7, Minor: 5}
	a100 := Info{Ordinal: 1, Name: "A100", Major: 8, Minor: 0}
	noDev := fmt.Errorf("cuda: no GPU: the CUDA driver /x/libcuda.so.1 (API 12.2) found no device: %w",
		&Error{Call: "cuInit", Code: 100, Name: "CUDA_ERROR_NO_DEVICE"})
	noLib := errors.New("cuda: the CUDA driver not found: no libcuda.so.1 in ...")
	nv := func() (compiler, error) { return fakeNVRTC{[]int{75, 80, 90}}, nil }
	nvOld := func() (compiler, error) { return fakeNVRTC{[]int{75, 80}}, nil }
	nvNone := func() (compiler, error) { return nil, errors.New("cuda: NVRTC not found: ...") }
	for _, c := range []struct {
		name    string
		spec    string
		devs    []Info
		err     error
		nvrtc   func() (compiler, error)
		want    string // "cpu", "cuda:N", or "error"
		errHas  string
		whyHas  string
		noProbe bool
	}{
		{name: "auto with an H100", spec: "auto", devs: []Info{h100}, nvrtc: nv, want: "cuda:0"},
		{name: "auto without a GPU", spec: "auto", err: noDev, nvrtc: nv, want: "cpu", whyHas: "CUDA_ERROR_NO_DEVICE"},
		{name: "auto without a driver", spec: "", err: noLib, nvrtc: nv, want: "cpu", whyHas: "not found"},
		{name: "auto skips an old GPU", spec: "auto", devs: []Info{t4, a100}, nvrtc: nv, want: "cuda:1"},
		{name: "auto with only an old GPU", spec: "auto", devs: []Info{t4}, nvrtc: nv, want: "cpu", whyHas: "sm_75"},
		{name: "auto without NVRTC", spec: "auto", devs: []Info{h100}, nvrtc: nvNone, want: "cpu", whyHas: "NVRTC not found"},
		{name: "auto, NVRTC too old for the GPU", spec: "auto", devs: []Info{h100}, nvrtc: nvOld, want: "cpu", whyHas: "cannot compile for"},
		{name: "cpu never probes", spec: "cpu", nvrtc: nv, want: "cpu", noProbe: true},
		{name: "cuda with an H100", spec: "cuda", devs: []Info{h100}, nvrtc: nv, want: "cuda:0"},
		{name: "cuda:1", spec: "cuda:1", devs: []Info{h100, a100}, nvrtc: nv, want: "cuda:1"},
		{name: "cuda without a GPU", spec: "cuda", err: noDev, nvrtc: nv, want: "error", errHas: "no GPU"},
		{name: "cuda without a driver", spec: "cuda:0", err: noLib, nvrtc: nv, want: "error", errHas: "not found"},
		{name: "cuda:2 of two", spec: "cuda:2", devs: []Info{h100, a100}, nvrtc: nv, want: "error", errHas: "sees 2 GPU"},
		{name: "cuda on an old GPU", spec: "cuda", devs: []Info{t4}, nvrtc: nv, want: "error", errHas: "sm_80 or newer"},
		{name: "cuda without NVRTC", spec: "cuda", devs: []Info{h100}, nvrtc: nvNone, want: "error", errHas: "NVRTC not found"},
		{name: "a bad value", spec: "gpu", nvrtc: nv, want: "error", errHas: "want auto, cpu, cuda or cuda:N", noProbe: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			probed := false
			devices := func() ([]Info, error) { probed = true; return c.devs, c.err }
			ch, err := selectDevice(c.spec, devices, c.nvrtc)
			if c.noProbe && probed {
				t.Error("probed the driver")
			}
			if c.want == "error" {
				if err == nil {
					t.Fatalf("got %v, want an error", ch)
				}
				if !strings.Contains(err.Error(), c.errHas) {
					t.Errorf("error %q lacks %q", err, c.errHas)
				}
				if c.err == noDev && !errors.Is(err, ErrNoDevice) {
					t.Errorf("error %v is not ErrNoDevice", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ch.String() != c.want {
				t.Errorf("chose %v (%s), want %s", ch, ch.Why, c.want)
			}
			if ch.CUDA && ch.Info.Ordinal != ch.Ordinal {
				t.Errorf("choice %v carries GPU %d's info", ch, ch.Info.Ordinal)
			}
			if !strings.Contains(ch.Why, c.whyHas) {
				t.Errorf("why %q lacks %q", ch.Why, c.whyHas)
			}
		})
	}
}

// TestSelectDeviceHere: on this machine, auto always answers (a GPU, or the CPU saying why),
// and cuda is either a working GPU or an error.
func TestSelectDeviceHere(t *testing.T) {
	ch, err := SelectDevice("auto")
	if err != nil {
		t.Fatalf("auto: %v", err)
	}
	t.Logf("--device auto: %v (%s)", ch, ch.Why)
	ch, err = SelectDevice("cuda")
	t.Logf("--device cuda: %v, %v", ch, err)
	if err == nil && !ch.CUDA {
		t.Errorf("--device cuda chose the CPU")
	}
}
