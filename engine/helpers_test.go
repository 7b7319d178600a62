package engine

import "os"

func mkdirTemp() (string, error) { return os.MkdirTemp("", "skein-engine-test-") }
