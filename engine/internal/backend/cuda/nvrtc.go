package cuda

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"unsafe"
)

// NVRTC is a loaded NVRTC library: CUDA C compiled to cubins (or PTX) at run time.
type NVRTC struct {
	Path         string
	Major, Minor int
	archs        []int // the sm_XX it can compile for (nil: it cannot say)

	nvrtcVersion              func(major, minor *int32) int32
	nvrtcGetErrorString       func(rc int32) *byte
	nvrtcCreateProgram        func(prog *uintptr, src, name *byte, nh int32, headers, includeNames unsafe.Pointer) int32
	nvrtcDestroyProgram       func(prog *uintptr) int32
	nvrtcCompileProgram       func(prog uintptr, n int32, opts unsafe.Pointer) int32
	nvrtcGetProgramLogSize    func(prog uintptr, n *uint64) int32
	nvrtcGetProgramLog        func(prog uintptr, log *byte) int32
	nvrtcGetCUBINSize         func(prog uintptr, n *uint64) int32
	nvrtcGetCUBIN             func(prog uintptr, b *byte) int32
	nvrtcGetPTXSize           func(prog uintptr, n *uint64) int32
	nvrtcGetPTX               func(prog uintptr, b *byte) int32
	nvrtcGetNumSupportedArchs func(n *int32) int32
	nvrtcGetSupportedArchs    func(a *int32) int32
}

// Version is "11.8".
func (n *NVRTC) Version() string { return fmt.Sprintf("%d.%d", n.Major, n.Minor) }

// Archs is the sm_XX numbers this NVRTC compiles for, ascending (nil when it cannot say).
func (n *NVRTC) Archs() []int { return slices.Clone(n.archs) }

// Supports: n compiles for sm_arch (assumed when it cannot say).
func (n *NVRTC) Supports(arch int) bool { return n.archs == nil || slices.Contains(n.archs, arch) }

var (
	nvrtcOnce sync.Once
	theNVRTC  *NVRTC
	nvrtcErr  error
)

// LoadNVRTC finds and loads NVRTC once per process (13, 12, then 11.2, in the folders searchDirs
// lists).
func LoadNVRTC() (*NVRTC, error) {
	nvrtcOnce.Do(func() { theNVRTC, nvrtcErr = loadNVRTC(searchDirs(osEnv())) })
	return theNVRTC, nvrtcErr
}

func loadNVRTC(dirs []searchDir) (*NVRTC, error) {
	h, path, err := openLib(libNVRTC, dirs)
	if err != nil {
		return nil, err
	}
	n := &NVRTC{Path: path}
	for _, r := range []struct {
		fn   any
		name string
	}{
		{&n.nvrtcVersion, "nvrtcVersion"}, {&n.nvrtcGetErrorString, "nvrtcGetErrorString"},
		{&n.nvrtcCreateProgram, "nvrtcCreateProgram"}, {&n.nvrtcDestroyProgram, "nvrtcDestroyProgram"},
		{&n.nvrtcCompileProgram, "nvrtcCompileProgram"}, {&n.nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize"},
		{&n.nvrtcGetProgramLog, "nvrtcGetProgramLog"}, {&n.nvrtcGetCUBINSize, "nvrtcGetCUBINSize"},
		{&n.nvrtcGetCUBIN, "nvrtcGetCUBIN"}, {&n.nvrtcGetPTXSize, "nvrtcGetPTXSize"}, {&n.nvrtcGetPTX, "nvrtcGetPTX"},
	} {
		if err := register(h, r.fn, r.name); err != nil {
			return nil, fmt.Errorf("cuda: NVRTC at %s: %v", path, err)
		}
	}
	var maj, min int32
	if rc := n.nvrtcVersion(&maj, &min); rc != 0 || maj == 0 {
		// A stub library answers with errors and version 0.0.
		return nil, fmt.Errorf("cuda: NVRTC at %s: nvrtcVersion returned %d (version %d.%d): not a working NVRTC", path, rc, maj, min)
	}
	n.Major, n.Minor = int(maj), int(min)
	// The supported-architecture list exists from NVRTC 11.2 on.
	if register(h, &n.nvrtcGetNumSupportedArchs, "nvrtcGetNumSupportedArchs") == nil &&
		register(h, &n.nvrtcGetSupportedArchs, "nvrtcGetSupportedArchs") == nil {
		var k int32
		if n.nvrtcGetNumSupportedArchs(&k) == 0 && k > 0 && k < 1024 {
			a := make([]int32, k)
			if n.nvrtcGetSupportedArchs(&a[0]) == 0 {
				for _, v := range a {
					n.archs = append(n.archs, int(v))
				}
				slices.Sort(n.archs)
			}
		}
	}
	return n, nil
}

func (n *NVRTC) errString(rc int32) string {
	if p := n.nvrtcGetErrorString(rc); p != nil {
		return goString(p)
	}
	return fmt.Sprintf("NVRTC error %d", rc)
}

// CompileOptions are what a compile is for.
type CompileOptions struct {
	Arch    int  // the compute capability: 80 for sm_80
	PTX     bool // compute_XX PTX (the driver JIT-compiles it) instead of an sm_XX cubin
	Verbose bool // ptxas's resource report (--ptxas-options=-v) in the log; cubins only
}

// Header is a file a source #includes by name ("common.cuh"): NVRTC reads it from memory.
type Header struct {
	Name, Source string
}

// Compiled is one compile's output.
type Compiled struct {
	Binary  []byte // the cubin (an ELF) or the PTX text
	PTX     bool
	Log     string // the compiler's log: warnings, and ptxas's report when Verbose
	Options []string
	NVRTC   string // the NVRTC version that compiled it
	Cached  bool   // read from a Cache, not compiled now
}

// flags is the NVRTC option list of o.
func (o CompileOptions) flags() []string {
	target := fmt.Sprintf("--gpu-architecture=sm_%d", o.Arch)
	if o.PTX {
		target = fmt.Sprintf("--gpu-architecture=compute_%d", o.Arch)
	}
	f := []string{target, "-default-device"}
	if o.Verbose && !o.PTX {
		f = append(f, "--ptxas-options=-v")
	}
	return f
}

// Compile compiles one CUDA C source (name is its file name, for messages) with its headers.
// A failed compile is an error carrying the compiler's log. Where this NVRTC refuses ptxas
// options, it compiles again without them (and the log has no resource report).
func (n *NVRTC) Compile(name, src string, headers []Header, o CompileOptions) (*Compiled, error) {
	if o.Arch <= 0 {
		return nil, fmt.Errorf("cuda: compile %s: no architecture", name)
	}
	if !n.Supports(o.Arch) {
		return nil, fmt.Errorf("cuda: compile %s: NVRTC %s (%s) cannot compile for sm_%d (it can: %v)", name, n.Version(), n.Path, o.Arch, n.archs)
	}
	flags := o.flags()
	if o.Verbose && !o.PTX && (n.Major > 12 || n.Major == 12 && n.Minor >= 9) {
		// NVRTC 12.9+ keeps compiles in memory: the same program compiled again in this process
		// comes back without running ptxas, so without its report. --no-cache compiles anew.
		flags = append(flags, "--no-cache")
	}
	c, err := n.compile(name, src, headers, flags, o.PTX)
	if err != nil && o.Verbose && (strings.Contains(c.Log, "ptxas-options") || strings.Contains(c.Log, "no-cache")) {
		flags = CompileOptions{Arch: o.Arch, PTX: o.PTX}.flags()
		c, err = n.compile(name, src, headers, flags, o.PTX)
	}
	return c, err
}

func (n *NVRTC) compile(name, src string, headers []Header, flags []string, ptx bool) (*Compiled, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var keep [][]byte // every C string, alive until the calls are done
	cstr := func(s string) *byte {
		b := append([]byte(s), 0)
		keep = append(keep, b)
		return &b[0]
	}
	var hdrs, names []*byte
	for _, h := range headers {
		hdrs = append(hdrs, cstr(h.Source))
		names = append(names, cstr(h.Name))
	}
	var hp, np unsafe.Pointer
	if len(headers) > 0 {
		hp, np = unsafe.Pointer(&hdrs[0]), unsafe.Pointer(&names[0])
	}
	var prog uintptr
	if rc := n.nvrtcCreateProgram(&prog, cstr(src), cstr(name), int32(len(headers)), hp, np); rc != 0 {
		return &Compiled{}, fmt.Errorf("cuda: nvrtcCreateProgram %s: %s (%d)", name, n.errString(rc), rc)
	}
	defer n.nvrtcDestroyProgram(&prog)
	opts := make([]*byte, len(flags))
	for i, f := range flags {
		opts[i] = cstr(f)
	}
	rc := n.nvrtcCompileProgram(prog, int32(len(opts)), unsafe.Pointer(&opts[0]))
	c := &Compiled{PTX: ptx, Options: flags, NVRTC: n.Version()}
	var ln uint64
	if n.nvrtcGetProgramLogSize(prog, &ln) == 0 && ln > 1 {
		b := make([]byte, ln)
		if n.nvrtcGetProgramLog(prog, &b[0]) == 0 {
			c.Log = strings.TrimRight(string(b[:ln-1]), "\x00\n")
		}
	}
	runtime.KeepAlive(keep)
	runtime.KeepAlive(hdrs)
	runtime.KeepAlive(names)
	runtime.KeepAlive(opts)
	if rc != 0 {
		return c, fmt.Errorf("cuda: compile %s (%s) with NVRTC %s: %s (%d):\n%s", name, strings.Join(flags, " "), n.Version(), n.errString(rc), rc, c.Log)
	}
	size, get, what := n.nvrtcGetCUBINSize, n.nvrtcGetCUBIN, "cubin"
	if ptx {
		size, get, what = n.nvrtcGetPTXSize, n.nvrtcGetPTX, "PTX"
	}
	var bn uint64
	if rc := size(prog, &bn); rc != 0 || bn == 0 {
		return c, fmt.Errorf("cuda: compile %s: no %s (%s, size %d)", name, what, n.errString(rc), bn)
	}
	c.Binary = make([]byte, bn)
	if rc := get(prog, &c.Binary[0]); rc != 0 {
		return c, fmt.Errorf("cuda: compile %s: reading the %s: %s", name, what, n.errString(rc))
	}
	if ptx {
		c.Binary = []byte(strings.TrimRight(string(c.Binary), "\x00"))
	}
	return c, nil
}
