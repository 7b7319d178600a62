// Package filebound reads the operator's model files with a bound: only regular files (links
// followed), never more than a stated size. A config.json, tokenizer.json or refs/main linked to
// /dev/zero would otherwise be read until memory ran out, and a FIFO would block start-up.
package filebound

import (
	"fmt"
	"io"
	"io/fs"
	"os"
)

// Open opens path for reading if it is a regular file. It looks before it opens, so a FIFO, a
// device or a directory is an error naming path, never a wait or an endless read.
func Open(path string) (*os.File, fs.FileInfo, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%s is not a regular file (%s)", path, kind(fi.Mode()))
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	if fi, err = f.Stat(); err != nil || !fi.Mode().IsRegular() { // replaced between the looks
		f.Close()
		if err == nil {
			err = fmt.Errorf("%s is not a regular file (%s)", path, kind(fi.Mode()))
		}
		return nil, nil, err
	}
	return f, fi, nil
}

// Read reads the regular file at path, of at most max bytes; a larger one (or one that grows
// past max while it is read) is an error naming path and the bound.
func Read(path string, max int64) ([]byte, error) {
	f, fi, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi.Size() > max {
		return nil, fmt.Errorf("%s is %d bytes, over the %d bytes such a file may have", path, fi.Size(), max)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s grew past the %d bytes such a file may have", path, max)
	}
	return b, nil
}

func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	}
	return m.Type().String()
}
