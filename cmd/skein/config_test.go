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
	clearSettingsEnv(t)
	fs, c := serveFlags()
	if _, err := parseSettings(fs, []string{"--config", path, "--addr", "127.0.0.1:1"}, "t"); err != nil {
		t.Fatal(err)
	}
	if c.Addr != "127.0.0.1:1" || c.MaxLoras != 4 || strings.Join(c.Models, ",") != "/a,/b" {
		t.Fatalf("addr %s (the command line wins), max-loras %d, models %v", c.Addr, c.MaxLoras, c.Models)
	}
	if err := os.WriteFile(path, []byte("no-such-flag: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fs, _ = serveFlags()
	if _, err := parseSettings(fs, []string{"--config=" + path}, "t"); err == nil || !strings.Contains(err.Error(), "no-such-flag") {
		t.Fatalf("unknown setting: %v", err)
	}
	// SKEIN_CONFIG names the file when --config does not.
	if err := os.WriteFile(path, []byte("replicas: 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SKEIN_CONFIG", path)
	fs, c = serveFlags()
	if _, err := parseSettings(fs, nil, "t"); err != nil || c.Replicas != 3 {
		t.Fatalf("SKEIN_CONFIG: replicas %d, %v", c.Replicas, err)
	}
}

// clearSettingsEnv unsets every SKEIN_* variable of the serve and worker flags for the test.
func clearSettingsEnv(t *testing.T) {
	t.Helper()
	for _, fs := range []*flag.FlagSet{first(serveFlags()), first(workerFlags())} {
		fs.VisitAll(func(f *flag.Flag) { t.Setenv(envName(f.Name), "") })
	}
}

func first[A, B any](a A, _ B) A { return a }
