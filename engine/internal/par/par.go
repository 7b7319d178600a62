// Package par spreads a loop over rows across the cores: the backends' kernels use it, and so
// does host-side work over rows that have reached the host (the sampler's draws).
package par

import (
	"runtime"
	"sync"
)

// Rows calls fn on GOMAXPROCS contiguous parts of [0, n) at once (fewer when n is small) and
// waits for them. A panic in fn is raised again on the caller's goroutine.
func Rows(n int, fn func(lo, hi int)) {
	k := min(runtime.GOMAXPROCS(0), n)
	if k <= 1 {
		fn(0, n)
		return
	}
	var wg sync.WaitGroup
	var once sync.Once
	var panicked any
	for i := range k {
		lo, hi := n*i/k, n*(i+1)/k
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if r := recover(); r != nil {
					once.Do(func() { panicked = r })
				}
			}()
			fn(lo, hi)
		}()
	}
	wg.Wait()
	if panicked != nil {
		panic(panicked)
	}
}
