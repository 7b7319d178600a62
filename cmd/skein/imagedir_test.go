package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --image-dir is where image_asset_pointer chunks may point; empty (the default) refuses file
// pointers. A directory that is not there is refused at startup, not at the first image.
func TestImageDirFlag(t *testing.T) {
	clearSettingsEnv(t)
	dir := t.TempDir()
	c, err := parseServeConfig([]string{"--image-dir", dir})
	if err != nil || c.ImageDir != dir {
		t.Fatalf("serve --image-dir: %+v, %v", c, err)
	}
	if c, err := parseServeConfig(nil); err != nil || c.ImageDir != "" {
		t.Fatalf("serve default image dir %q, %v", c.ImageDir, err)
	}
	file := filepath.Join(dir, "f.png")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{filepath.Join(dir, "missing"), file} {
		if _, err := parseServeConfig([]string{"--image-dir", bad}); err == nil || !strings.Contains(err.Error(), "--image-dir") {
			t.Errorf("serve --image-dir %s: %v, want an error naming --image-dir", bad, err)
		}
	}
	fs, wc := workerFlags()
	if _, err := parseSettings(fs, []string{"--image-dir", dir}, workerSynopsis); err != nil || wc.ImageDir != dir {
		t.Fatalf("worker --image-dir: %q, %v", wc.ImageDir, err)
	}
}
