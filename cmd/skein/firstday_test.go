package main

import (
	"bytes"
	"log/slog"
	"regexp"
	"strings"
	"testing"
)

// Every flag line of every --help names the flag and at most a one-word placeholder: a usage
// text with backquotes makes Go's flag package take the quoted words as the placeholder
// (`--model skein model init-tiny --preset small`), which reads as nonsense (issue 22).
func TestHelpPlaceholdersAreOneWord(t *testing.T) {
	line := regexp.MustCompile(`^  --[a-z0-9-]+( [a-zA-Z0-9_.]+)?$`)
	for _, args := range [][]string{{"serve", "--help"}, {"worker", "--help"}, {"model", "init-tiny", "--help"},
		{"bench", "engine", "--help"}, {"keys", "create", "--help"}} {
		out, err := captureOutput(t, args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "  --") && !line.MatchString(l) {
				t.Errorf("%v: flag line %q", args, l)
			}
		}
	}
}

// A binary built without GOEXPERIMENT=simd runs the engine's scalar loops, about 12× slower on
// amd64: serve, worker and bench say so at start-up, with how to rebuild; a SIMD build, or an
// architecture without the vector kernels, says nothing (issue 22).
func TestWarnsWhenBuiltWithoutSIMD(t *testing.T) {
	msg := simdWarning(false, "amd64")
	if !strings.Contains(msg, "GOEXPERIMENT=simd") || !strings.Contains(msg, "slower") {
		t.Errorf("warning %q does not say what is wrong and how to fix it", msg)
	}
	for _, quiet := range []struct {
		built bool
		arch  string
	}{{true, "amd64"}, {false, "arm64"}, {true, "arm64"}} {
		if m := simdWarning(quiet.built, quiet.arch); m != "" {
			t.Errorf("simd %v on %s: warns %q", quiet.built, quiet.arch, m)
		}
	}
	var b bytes.Buffer
	warnSIMD(slog.New(slog.NewJSONHandler(&b, nil)), false, "amd64")
	if !strings.Contains(b.String(), `"level":"WARN"`) || !strings.Contains(b.String(), "GOEXPERIMENT=simd") {
		t.Errorf("logged %q", b.String())
	}
}
