//go:build !(linux && amd64)

package cpu

import "errors"

func requestTileState() error { return errors.New("AMX tile state: only requested on linux/amd64") }
