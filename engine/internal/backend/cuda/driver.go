package cuda

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Result codes of the driver API this package names (cuda.h's CUresult).
const (
	cudaSuccess          = 0
	cudaErrNotInit       = 3
	cudaErrNoDevice      = 100
	cudaErrInvalidDevice = 101
)

// ErrNoDevice: the driver loaded but sees no GPU (cuInit's CUDA_ERROR_NO_DEVICE, as on a
// machine with the driver's library and no GPU, or a container without one passed in).
var ErrNoDevice = errors.New("cuda: no CUDA device")

// Error is a driver API call that failed.
type Error struct {
	Call string // the entry point: "cuInit"
	Code int    // its CUresult
	Name string // CUDA_ERROR_NO_DEVICE (from the driver when it can say)
	Desc string // the driver's sentence for it, when it can say
}

func (e *Error) Error() string {
	s := fmt.Sprintf("cuda: %s: %s (%d)", e.Call, e.Name, e.Code)
	if e.Desc != "" {
		s += ": " + e.Desc
	}
	return s
}

// Is makes errors.Is(err, ErrNoDevice) hold for CUDA_ERROR_NO_DEVICE.
func (e *Error) Is(target error) bool { return target == ErrNoDevice && e.Code == cudaErrNoDevice }

// driver is libcuda's entry points, loaded once.
type driver struct {
	path string

	cuInit               func(flags uint32) int32
	cuDriverGetVersion   func(v *int32) int32
	cuDeviceGetCount     func(n *int32) int32
	cuDeviceGet          func(dev *int32, ordinal int32) int32
	cuDeviceGetName      func(name *byte, n int32, dev int32) int32
	cuDeviceTotalMem     func(bytes *uint64, dev int32) int32
	cuDeviceGetAttribute func(v *int32, attr int32, dev int32) int32
	cuGetErrorName       func(code int32, s **byte) int32
	cuGetErrorString     func(code int32, s **byte) int32

	// Contexts, memory, modules and launches (context.go).
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, dev int32) int32
	cuDevicePrimaryCtxRelease func(dev int32) int32
	cuCtxSetCurrent           func(ctx uintptr) int32
	cuCtxSynchronize          func() int32
	cuMemGetInfo              func(free, total *uint64) int32
	cuMemAlloc                func(p *uintptr, bytes uint64) int32
	cuMemFree                 func(p uintptr) int32
	cuMemcpyHtoD              func(dst uintptr, src unsafe.Pointer, bytes uint64) int32
	cuMemcpyDtoH              func(dst unsafe.Pointer, src uintptr, bytes uint64) int32
	cuMemsetD8                func(dst uintptr, v uint8, n uint64) int32
	cuModuleLoadData          func(m *uintptr, image unsafe.Pointer) int32
	cuModuleUnload            func(m uintptr) int32
	cuModuleGetFunction       func(f *uintptr, m uintptr, name *byte) int32
	cuLaunchKernel            func(f uintptr, gx, gy, gz, bx, by, bz, shared uint32, stream uintptr, params, extra unsafe.Pointer) int32
}

// register binds fn (a pointer to a func variable) to the symbol name of lib: an error, not
// purego's panic, when the library lacks it.
func register(lib uintptr, fn any, name string) error {
	sym, err := purego.Dlsym(lib, name)
	if err != nil || sym == 0 {
		return fmt.Errorf("symbol %s missing: %v", name, err)
	}
	purego.RegisterFunc(fn, sym)
	return nil
}

func loadDriver(dirs []searchDir) (*driver, error) {
	h, path, err := openLib(libDriver, dirs)
	if err != nil {
		return nil, err
	}
	d := &driver{path: path}
	for _, r := range []struct {
		fn   any
		name string
	}{
		{&d.cuInit, "cuInit"}, {&d.cuDriverGetVersion, "cuDriverGetVersion"}, {&d.cuDeviceGetCount, "cuDeviceGetCount"},
		{&d.cuDeviceGet, "cuDeviceGet"}, {&d.cuDeviceGetName, "cuDeviceGetName"}, {&d.cuDeviceTotalMem, "cuDeviceTotalMem_v2"},
		{&d.cuDeviceGetAttribute, "cuDeviceGetAttribute"}, {&d.cuGetErrorName, "cuGetErrorName"}, {&d.cuGetErrorString, "cuGetErrorString"},
		{&d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"}, {&d.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"},
		{&d.cuCtxSetCurrent, "cuCtxSetCurrent"}, {&d.cuCtxSynchronize, "cuCtxSynchronize"}, {&d.cuMemGetInfo, "cuMemGetInfo_v2"},
		{&d.cuMemAlloc, "cuMemAlloc_v2"}, {&d.cuMemFree, "cuMemFree_v2"}, {&d.cuMemcpyHtoD, "cuMemcpyHtoD_v2"},
		{&d.cuMemcpyDtoH, "cuMemcpyDtoH_v2"}, {&d.cuMemsetD8, "cuMemsetD8_v2"}, {&d.cuModuleLoadData, "cuModuleLoadData"},
		{&d.cuModuleUnload, "cuModuleUnload"}, {&d.cuModuleGetFunction, "cuModuleGetFunction"}, {&d.cuLaunchKernel, "cuLaunchKernel"},
	} {
		if err := register(h, r.fn, r.name); err != nil {
			return nil, fmt.Errorf("cuda: the CUDA driver at %s: %v", path, err)
		}
	}
	return d, nil
}

// check turns a CUresult into an *Error naming the call.
func (d *driver) check(call string, rc int32) error {
	if rc == cudaSuccess {
		return nil
	}
	e := &Error{Call: call, Code: int(rc), Name: fallbackName(int(rc))}
	var s *byte
	if d.cuGetErrorName(rc, &s) == cudaSuccess && s != nil {
		e.Name = goString(s)
	}
	s = nil
	if d.cuGetErrorString(rc, &s) == cudaSuccess && s != nil {
		e.Desc = goString(s)
	}
	return e
}

func fallbackName(code int) string {
	switch code {
	case cudaErrNotInit:
		return "CUDA_ERROR_NOT_INITIALIZED"
	case cudaErrNoDevice:
		return "CUDA_ERROR_NO_DEVICE"
	case cudaErrInvalidDevice:
		return "CUDA_ERROR_INVALID_DEVICE"
	}
	return "CUDA_ERROR"
}

// goString copies a NUL-terminated C string (the driver's own static text).
func goString(p *byte) string {
	var b []byte
	for i := 0; i < 4096; i++ {
		c := *(*byte)(unsafe.Add(unsafe.Pointer(p), i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

var (
	driverOnce sync.Once
	theDriver  *driver
	driverErr  error
	initErr    error
)

// getDriver loads libcuda and runs cuInit once per process.
func getDriver() (*driver, error) {
	driverOnce.Do(func() {
		theDriver, driverErr = loadDriver(searchDirs(osEnv()))
		if driverErr == nil {
			initErr = theDriver.init()
		}
	})
	if driverErr != nil {
		return nil, driverErr
	}
	return theDriver, initErr
}

// init is cuInit, its failure made into one clear error: CUDA_ERROR_NO_DEVICE says so, with the
// driver's path and version.
func (d *driver) init() error {
	err := d.check("cuInit", d.cuInit(0))
	if err == nil {
		return nil
	}
	v := d.version()
	if errors.Is(err, ErrNoDevice) {
		return fmt.Errorf("cuda: no GPU: the CUDA driver %s (API %s) found no device: %w", d.path, v, err)
	}
	return fmt.Errorf("cuda: the CUDA driver %s (API %s) did not initialise: %w", d.path, v, err)
}

// version is the driver API version as "12.2" ("?" when it cannot say).
func (d *driver) version() string {
	var v int32
	if d.cuDriverGetVersion(&v) != cudaSuccess {
		return "?"
	}
	return fmt.Sprintf("%d.%d", v/1000, v%1000/10)
}

// Device attributes (cuda.h's CUdevice_attribute).
const (
	attrMultiprocessorCount = 16
	attrComputeMajor        = 75
	attrComputeMinor        = 76
)

// Info is what the probe says of one GPU.
type Info struct {
	Ordinal       int
	Name          string
	TotalMemory   uint64 // bytes
	Major, Minor  int    // compute capability
	SMs           int
	DriverVersion string // the driver API's version: "12.2"
	DriverPath    string // where libcuda was loaded from
}

// Arch is the compute capability as NVRTC names it: 90 for sm_90.
func (i Info) Arch() int { return i.Major*10 + i.Minor }

func (i Info) String() string {
	return fmt.Sprintf("cuda:%d %s (sm_%d, %d SMs, %.1f GiB, driver API %s)", i.Ordinal, i.Name, i.Arch(), i.SMs, float64(i.TotalMemory)/(1<<30), i.DriverVersion)
}

// Devices probes every GPU the driver sees. No driver library, or a driver that sees no GPU,
// is an error (errors.Is(err, ErrNoDevice) for the latter).
func Devices() ([]Info, error) {
	d, err := getDriver()
	if err != nil {
		return nil, err
	}
	return d.devices()
}

func (d *driver) devices() ([]Info, error) {
	var n int32
	if err := d.check("cuDeviceGetCount", d.cuDeviceGetCount(&n)); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("cuda: no GPU: the CUDA driver %s counts 0 devices: %w", d.path, ErrNoDevice)
	}
	v := d.version()
	out := make([]Info, 0, n)
	for o := range n {
		i, err := d.info(int(o))
		if err != nil {
			return nil, err
		}
		i.DriverVersion = v
		out = append(out, i)
	}
	return out, nil
}

func (d *driver) info(ordinal int) (Info, error) {
	i := Info{Ordinal: ordinal, DriverPath: d.path}
	var dev int32
	if err := d.check("cuDeviceGet", d.cuDeviceGet(&dev, int32(ordinal))); err != nil {
		return i, err
	}
	name := make([]byte, 256)
	if err := d.check("cuDeviceGetName", d.cuDeviceGetName(&name[0], int32(len(name)), dev)); err != nil {
		return i, err
	}
	for k, c := range name {
		if c == 0 {
			name = name[:k]
			break
		}
	}
	i.Name = string(name)
	if err := d.check("cuDeviceTotalMem", d.cuDeviceTotalMem(&i.TotalMemory, dev)); err != nil {
		return i, err
	}
	for _, a := range []struct {
		attr int32
		v    *int
	}{{attrComputeMajor, &i.Major}, {attrComputeMinor, &i.Minor}, {attrMultiprocessorCount, &i.SMs}} {
		var v int32
		if err := d.check("cuDeviceGetAttribute", d.cuDeviceGetAttribute(&v, a.attr, dev)); err != nil {
			return i, err
		}
		*a.v = int(v)
	}
	return i, nil
}

// Device is one GPU, probed. (Contexts, memory and launches come with the backend's Step.)
type Device struct {
	Info
}

// Open probes GPU ordinal: the device, or why there is none (errors.Is(err, ErrNoDevice) when
// the driver sees no GPU).
func Open(ordinal int) (*Device, error) {
	devs, err := Devices()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= len(devs) {
		return nil, fmt.Errorf("cuda: no device cuda:%d: the driver sees %d (cuda:0 to cuda:%d)", ordinal, len(devs), len(devs)-1)
	}
	return &Device{devs[ordinal]}, nil
}
