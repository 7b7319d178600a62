package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// serve refuses what it can check before any model work: a bad --precision or --activations, and an address in
// use (taken before the models load), each before the tiny model is generated.
func TestServeChecksBeforeLoading(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, c := range []struct {
		name, want string
		args       []string
	}{
		{"precision", "unknown precision", []string{"--addr", "127.0.0.1:0", "--precision", "f16x"}},
		{"activations", "unknown activations", []string{"--addr", "127.0.0.1:0", "--activations", "int8"}},
		{"port in use", "address already in use", []string{"--addr", taken.Addr().String()}},
		{"sampler copies", "--sampler-copies 0", []string{"--addr", "127.0.0.1:0", "--sampler-copies", "0"}},
		{"negative kv cache", "--kv-cache-mb -1", []string{"--addr", "127.0.0.1:0", "--kv-cache-mb", "-1"}},
		{"huge kv cache", "--kv-cache-mb 2097152", []string{"--addr", "127.0.0.1:0", "--kv-cache-mb", "2097152"}},
		{"tiny prefill chunk", "--prefill-chunk 8", []string{"--addr", "127.0.0.1:0", "--prefill-chunk", "8"}},
		{"huge prefill chunk", "--prefill-chunk 4096", []string{"--addr", "127.0.0.1:0", "--prefill-chunk", "4096"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			data := t.TempDir()
			err := run(append([]string{"serve", "--data", data}, c.args...))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
			if _, err := os.Stat(filepath.Join(data, "models", "tiny-qwen3")); !os.IsNotExist(err) {
				t.Fatalf("the tiny model was generated before the refusal (stat: %v)", err)
			}
		})
	}
}
