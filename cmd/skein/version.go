package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is the release, set at build time: go build -ldflags "-X main.version=v1.2.3" (the
// Makefile sets it from git describe).
var version = "dev"

// versionString is version, the VCS revision the binary was built from (when Go recorded one),
// and the Go version.
func versionString() string {
	s := "skein " + version
	if info, ok := debug.ReadBuildInfo(); ok {
		var rev, modified string
		for _, kv := range info.Settings {
			switch kv.Key {
			case "vcs.revision":
				rev = kv.Value
			case "vcs.modified":
				if kv.Value == "true" {
					modified = "+modified"
				}
			}
		}
		if rev != "" {
			s += fmt.Sprintf(" (revision %s%s)", rev, modified)
		}
	}
	return s + " " + runtime.Version()
}
