package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConfigFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "skein.yaml")
	if err := os.WriteFile(path, []byte("addr: 0.0.0.0:9000\nmax-loras: 4\nmodel: [/a, /b]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	newFS := func() (*flag.FlagSet, *string, *int, *multiFlag) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		addr := fs.String("addr", "127.0.0.1:8000", "")
		ml := fs.Int("max-loras", 16, "")
		var models multiFlag
		fs.Var(&models, "model", "")
		fs.String("config", "", "")
		return fs, addr, ml, &models
	}
	fs, addr, ml, models := newFS()
	args := []string{"--config", path, "--addr", "127.0.0.1:1"}
	if err := applyConfigFile(fs, args); err != nil {
		t.Fatal(err)
	}
	if _, err := parseInterspersed(fs, args); err != nil {
		t.Fatal(err)
	}
	if *addr != "127.0.0.1:1" || *ml != 4 || strings.Join(*models, ",") != "/a,/b" {
		t.Fatalf("addr %s (the command line wins), max-loras %d, models %v", *addr, *ml, *models)
	}
	if err := os.WriteFile(path, []byte("no-such-flag: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fs, _, _, _ = newFS()
	if err := applyConfigFile(fs, []string{"--config=" + path}); err == nil || !strings.Contains(err.Error(), "no-such-flag") {
		t.Fatalf("unknown setting: %v", err)
	}
}
