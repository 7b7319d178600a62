package main

import (
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
