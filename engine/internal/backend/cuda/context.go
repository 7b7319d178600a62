package cuda

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// Context is a GPU's primary context, with the few calls the kernels' tests need: memory,
// copies, modules and launches. A CUDA context is current per OS thread, so each call locks its
// goroutine to its thread and makes the context current there first (one driver call, ~0.3 µs);
// the backend's Step will instead keep one locked goroutine per GPU and send it the work.
type Context struct {
	d   *driver
	dev int32
	ctx uintptr

	mu     sync.Mutex
	closed bool
}

// DevPtr is a device address.
type DevPtr uintptr

// NewContext retains dev's primary context.
func (dv *Device) NewContext() (*Context, error) {
	d, err := getDriver()
	if err != nil {
		return nil, err
	}
	c := &Context{d: d}
	if err := d.check("cuDeviceGet", d.cuDeviceGet(&c.dev, int32(dv.Ordinal))); err != nil {
		return nil, err
	}
	if err := d.check("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(&c.ctx, c.dev)); err != nil {
		return nil, err
	}
	return c, nil
}

// on runs fn on a locked OS thread with the context current.
func (c *Context) on(fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return fmt.Errorf("cuda: context closed")
	}
	if err := c.d.check("cuCtxSetCurrent", c.d.cuCtxSetCurrent(c.ctx)); err != nil {
		return err
	}
	return fn()
}

// Close releases the primary context (its memory and modules go with the last release).
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	return c.d.check("cuDevicePrimaryCtxRelease", c.d.cuDevicePrimaryCtxRelease(c.dev))
}

// MemInfo is the device's free and total memory.
func (c *Context) MemInfo() (free, total uint64, err error) {
	err = c.on(func() error { return c.d.check("cuMemGetInfo", c.d.cuMemGetInfo(&free, &total)) })
	return free, total, err
}

// Alloc is bytes of device memory, zeroed.
func (c *Context) Alloc(bytes int) (DevPtr, error) {
	var p uintptr
	err := c.on(func() error {
		if err := c.d.check("cuMemAlloc", c.d.cuMemAlloc(&p, uint64(max(bytes, 1)))); err != nil {
			return err
		}
		return c.d.check("cuMemsetD8", c.d.cuMemsetD8(p, 0, uint64(max(bytes, 1))))
	})
	return DevPtr(p), err
}

// Free gives p back.
func (c *Context) Free(p DevPtr) error {
	return c.on(func() error { return c.d.check("cuMemFree", c.d.cuMemFree(uintptr(p))) })
}

// CopyIn copies a host slice to p (synchronous).
func CopyIn[T any](c *Context, p DevPtr, src []T) error {
	if len(src) == 0 {
		return nil
	}
	n := uint64(len(src)) * uint64(unsafe.Sizeof(src[0]))
	err := c.on(func() error {
		return c.d.check("cuMemcpyHtoD", c.d.cuMemcpyHtoD(uintptr(p), unsafe.Pointer(&src[0]), n))
	})
	runtime.KeepAlive(src)
	return err
}

// CopyOut copies p into a host slice (synchronous).
func CopyOut[T any](c *Context, dst []T, p DevPtr) error {
	if len(dst) == 0 {
		return nil
	}
	n := uint64(len(dst)) * uint64(unsafe.Sizeof(dst[0]))
	err := c.on(func() error {
		return c.d.check("cuMemcpyDtoH", c.d.cuMemcpyDtoH(unsafe.Pointer(&dst[0]), uintptr(p), n))
	})
	runtime.KeepAlive(dst)
	return err
}

// Module is a loaded cubin or PTX.
type Module struct {
	c *Context
	m uintptr
}

// Load loads a compiled kernel file (a cubin, or PTX the driver compiles).
func (c *Context) Load(comp *Compiled) (*Module, error) {
	img := comp.Binary
	if comp.PTX {
		img = append(append([]byte(nil), img...), 0)
	}
	if len(img) == 0 {
		return nil, fmt.Errorf("cuda: empty module")
	}
	var m uintptr
	err := c.on(func() error { return c.d.check("cuModuleLoadData", c.d.cuModuleLoadData(&m, unsafe.Pointer(&img[0]))) })
	runtime.KeepAlive(img)
	if err != nil {
		return nil, err
	}
	return &Module{c, m}, nil
}

// Unload unloads the module.
func (m *Module) Unload() error {
	return m.c.on(func() error { return m.c.d.check("cuModuleUnload", m.c.d.cuModuleUnload(m.m)) })
}

// Function is a kernel of a module.
type Function struct {
	c    *Context
	f    uintptr
	Name string
}

// Function finds a kernel by its (extern "C") name.
func (m *Module) Function(name string) (Function, error) {
	var f uintptr
	b := append([]byte(name), 0)
	err := m.c.on(func() error {
		return m.c.d.check("cuModuleGetFunction "+name, m.c.d.cuModuleGetFunction(&f, m.m, &b[0]))
	})
	return Function{m.c, f, name}, err
}

// Launch runs the kernel on a grid of blocks (default stream) and waits for it. Each argument
// is the kernel parameter's value: DevPtr, int32, int64, uint32, float32 or float64 (a Go int
// is refused: say which width the kernel takes).
func (f Function) Launch(grid, block int, args ...any) error {
	vals := make([]uint64, len(args)) // each argument's bytes, 8-aligned
	params := make([]unsafe.Pointer, len(args))
	for i, a := range args {
		p := unsafe.Pointer(&vals[i])
		switch v := a.(type) {
		case DevPtr:
			*(*uintptr)(p) = uintptr(v)
		case int32:
			*(*int32)(p) = v
		case uint32:
			*(*uint32)(p) = v
		case int64:
			*(*int64)(p) = v
		case float32:
			*(*float32)(p) = v
		case float64:
			*(*float64)(p) = v
		default:
			return fmt.Errorf("cuda: launch %s: argument %d is a %T", f.Name, i, a)
		}
		params[i] = p
	}
	var pp unsafe.Pointer
	if len(params) > 0 {
		pp = unsafe.Pointer(&params[0])
	}
	err := f.c.on(func() error {
		if err := f.c.d.check("cuLaunchKernel "+f.Name, f.c.d.cuLaunchKernel(f.f, uint32(grid), 1, 1, uint32(block), 1, 1, 0, 0, pp, nil)); err != nil {
			return err
		}
		return f.c.d.check("cuCtxSynchronize after "+f.Name, f.c.d.cuCtxSynchronize())
	})
	runtime.KeepAlive(vals)
	runtime.KeepAlive(params)
	return err
}
