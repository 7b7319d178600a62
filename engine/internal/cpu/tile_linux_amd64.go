package cpu

import (
	"fmt"
	"syscall"
)

// requestTileState asks Linux for the AMX tile data state (arch_prctl ARCH_REQ_XCOMP_PERM,
// XFEATURE_XTILEDATA), which a process must hold before its first tile instruction; the grant
// covers every thread of the process, those started later included.
func requestTileState() error {
	const archReqXcompPerm, xfeatureXtiledata = 0x1023, 18
	if _, _, errno := syscall.RawSyscall(syscall.SYS_ARCH_PRCTL, archReqXcompPerm, xfeatureXtiledata, 0); errno != 0 {
		return fmt.Errorf("arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA): %w", errno)
	}
	return nil
}
