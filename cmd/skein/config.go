package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"gopkg.in/yaml.v3"
)

// applyConfigFile sets flags from a YAML file of `flag-name: value` pairs (a list for repeatable
// flags such as model). Precedence: command-line flags, then SKEIN_* variables (flag defaults),
// then the file; zero configuration works.
func applyConfigFile(fs *flag.FlagSet, args []string) error {
	path := os.Getenv("SKEIN_CONFIG")
	for i, a := range args {
		switch {
		case a == "--config" || a == "-config":
			if i+1 < len(args) {
				path = args[i+1]
			}
		case strings.HasPrefix(a, "--config="), strings.HasPrefix(a, "-config="):
			path = a[strings.Index(a, "=")+1:]
		}
	}
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(b, &values); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	onCommandLine := map[string]bool{}
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			name := strings.TrimLeft(a, "-")
			name, _, _ = strings.Cut(name, "=")
			onCommandLine[name] = true
		}
	}
	for name, v := range values {
		if name == "config" || onCommandLine[name] {
			continue
		}
		if fs.Lookup(name) == nil {
			return fmt.Errorf("config file %s: unknown setting %q", path, name)
		}
		list, isList := v.([]any)
		if !isList {
			list = []any{v}
		}
		for _, item := range list {
			if err := fs.Set(name, fmt.Sprint(item)); err != nil {
				return fmt.Errorf("config file %s: %s: %w", path, name, err)
			}
		}
	}
	return nil
}
