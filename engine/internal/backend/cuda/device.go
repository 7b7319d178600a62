package cuda

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MinArch is the oldest GPU the backend runs on: sm_80 (Ampere), for bf16 tensor-core GEMMs.
const MinArch = 80

// Choice is where an engine computes, as --device decided it.
type Choice struct {
	CUDA    bool // false: the CPU
	Ordinal int  // the GPU, when CUDA
	Info    Info // the GPU's probe, when CUDA
	// Why says how the choice was made: for auto on the CPU, why no GPU was taken.
	Why string
}

func (c Choice) String() string {
	if c.CUDA {
		return fmt.Sprintf("cuda:%d", c.Ordinal)
	}
	return "cpu"
}

// ParseDevice reads a --device value: auto (or ""), cpu, cuda (GPU 0) or cuda:N. kind is
// "auto", "cpu" or "cuda".
func ParseDevice(s string) (kind string, ordinal int, err error) {
	switch v := strings.ToLower(strings.TrimSpace(s)); {
	case v == "" || v == "auto":
		return "auto", 0, nil
	case v == "cpu":
		return "cpu", 0, nil
	case v == "cuda":
		return "cuda", 0, nil
	case strings.HasPrefix(v, "cuda:"):
		n, err := strconv.Atoi(v[len("cuda:"):])
		if err != nil || n < 0 {
			return "", 0, fmt.Errorf("--device %q: cuda:N takes a GPU number ≥ 0", s)
		}
		return "cuda", n, nil
	}
	return "", 0, fmt.Errorf("--device %q: want auto, cpu, cuda or cuda:N", s)
}

// SelectDevice decides --device on this machine: auto is the first working GPU (the driver
// sees it, it is sm_80 or newer, and NVRTC loads and compiles for it), else the CPU (Why says
// why); cpu is the CPU without probing; cuda and cuda:N are that GPU, or an error saying why
// it cannot be used (errors.Is(err, ErrNoDevice) when the driver sees no GPU).
func SelectDevice(spec string) (Choice, error) {
	return selectDevice(spec, Devices, func() (compiler, error) { return LoadNVRTC() })
}

// compiler is what SelectDevice asks of NVRTC.
type compiler interface {
	Supports(arch int) bool
	Version() string
}

func selectDevice(spec string, devices func() ([]Info, error), nvrtc func() (compiler, error)) (Choice, error) {
	kind, ordinal, err := ParseDevice(spec)
	if err != nil {
		return Choice{}, err
	}
	if kind == "cpu" {
		return Choice{Why: "--device cpu"}, nil
	}
	devs, err := devices()
	if err == nil && len(devs) == 0 {
		err = fmt.Errorf("cuda: no GPU: %w", ErrNoDevice)
	}
	if err != nil {
		if kind == "auto" {
			return Choice{Why: err.Error()}, nil
		}
		return Choice{}, fmt.Errorf("--device %s: %w", spec, err)
	}
	// usable says why GPU i cannot run the backend ("" when it can).
	var nv compiler
	var nvErr error
	nvLoaded := false
	usable := func(i Info) string {
		if i.Arch() < MinArch {
			return fmt.Sprintf("%s is sm_%d; the CUDA backend needs sm_%d or newer", i, i.Arch(), MinArch)
		}
		if !nvLoaded {
			nv, nvErr = nvrtc()
			nvLoaded = true
		}
		if nvErr != nil {
			return nvErr.Error()
		}
		if !nv.Supports(i.Arch()) {
			return fmt.Sprintf("NVRTC %s cannot compile for %s", nv.Version(), i)
		}
		return ""
	}
	if kind == "auto" {
		var why []string
		for _, i := range devs {
			w := usable(i)
			if w == "" {
				return Choice{CUDA: true, Ordinal: i.Ordinal, Info: i, Why: "--device auto: the first working GPU"}, nil
			}
			why = append(why, w)
		}
		return Choice{Why: strings.Join(why, "; ")}, nil
	}
	if ordinal >= len(devs) {
		return Choice{}, fmt.Errorf("--device %s: the driver sees %d GPU(s) (cuda:0 to cuda:%d)", spec, len(devs), len(devs)-1)
	}
	i := devs[ordinal]
	if w := usable(i); w != "" {
		return Choice{}, errors.New("--device " + spec + ": " + w)
	}
	return Choice{CUDA: true, Ordinal: ordinal, Info: i, Why: "--device " + spec}, nil
}
