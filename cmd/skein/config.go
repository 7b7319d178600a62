package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// Every flag of a command that uses parseSettings can be set three more ways, found from its name
// alone so that no flag can miss one: the SKEIN_* variable envName(name), the YAML key name in
// the --config file (SKEIN_CONFIG), and its default. Precedence: command line, then variable,
// then file, then default. A repeatable flag (model) takes a comma-separated variable or a YAML
// list, and a layer that sets it replaces the lower layers' values.

// envName is the variable of a flag: SKEIN_ and the name in capitals, - as _.
func envName(flagName string) string {
	return "SKEIN_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// deprecatedPrefix starts the usage of a flag kept as an alias of a renamed one.
const deprecatedPrefix = "deprecated: "

// aliasFlag registers old as a deprecated second name of the flag name (same value).
func aliasFlag(fs *flag.FlagSet, old, name string) {
	fs.Var(fs.Lookup(name).Value, old, deprecatedPrefix+"use --"+name)
}

// parseSettings parses a command's arguments (flags and positional arguments in any order), then
// fills each flag the command line left alone from its variable, else from the YAML file. On
// --help it prints the usage to stdout and returns flag.ErrHelp.
func parseSettings(fs *flag.FlagSet, args []string, synopsis string) ([]string, error) {
	pos, err := parseCommandLine(fs, args, synopsis, true)
	if err != nil {
		return nil, err
	}
	// Aliases share a Value: a flag is set once whichever of its names set it.
	set := map[flag.Value]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Value] = true })
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		v, ok := os.LookupEnv(envName(f.Name))
		if !ok || v == "" || set[f.Value] || envErr != nil {
			return
		}
		items := []string{v}
		if _, repeatable := f.Value.(*multiFlag); repeatable {
			items = strings.Split(v, ",")
		}
		if envErr = setAll(fs, f, items); envErr != nil {
			envErr = fmt.Errorf("%s: %w", envName(f.Name), envErr)
		}
		set[f.Value] = true
	})
	if envErr != nil {
		return nil, envErr
	}
	if err := applyConfigFile(fs, set); err != nil {
		return nil, err
	}
	fs.Visit(func(f *flag.Flag) {
		if strings.HasPrefix(f.Usage, deprecatedPrefix) {
			// Before the logger exists, but after --log-format is known: a JSON log gets a JSON line.
			if lf := fs.Lookup("log-format"); lf != nil && strings.EqualFold(lf.Value.String(), "json") {
				slog.New(slog.NewJSONHandler(os.Stderr, nil)).Warn("--"+f.Name+" is "+f.Usage, "flag", f.Name)
				return
			}
			fmt.Fprintf(os.Stderr, "skein: --%s is %s\n", f.Name, f.Usage)
		}
	})
	return pos, nil
}

// usageOutput receives --help's usage (a variable for tests).
var usageOutput io.Writer = os.Stdout

// parseArgs parses the command line alone (no variables, no file), for commands without them;
// --help prints the usage to stdout and returns flag.ErrHelp.
func parseArgs(fs *flag.FlagSet, args []string, synopsis string) ([]string, error) {
	return parseCommandLine(fs, args, synopsis, false)
}

func parseCommandLine(fs *flag.FlagSet, args []string, synopsis string, withSettings bool) ([]string, error) {
	fs.SetOutput(io.Discard) // errors are returned; the usage goes to stdout on --help only
	pos, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		printUsage(usageOutput, fs, synopsis, withSettings)
	}
	return pos, err
}

// setAll sets a flag to items, replacing a repeatable flag's earlier values.
func setAll(fs *flag.FlagSet, f *flag.Flag, items []string) error {
	if m, ok := f.Value.(*multiFlag); ok {
		*m = nil
	}
	for _, item := range items {
		if err := fs.Set(f.Name, item); err != nil {
			return err
		}
	}
	return nil
}

// applyConfigFile sets the flags not in set from the YAML file of --config (or SKEIN_CONFIG,
// already applied to the flag): `flag-name: value` pairs, a list for a repeatable flag.
func applyConfigFile(fs *flag.FlagSet, set map[flag.Value]bool) error {
	cf := fs.Lookup("config")
	if cf == nil || cf.Value.String() == "" {
		return nil
	}
	path := cf.Value.String()
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(b, &values); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	names := make([]string, 0, len(values))
	for name := range values {
		names = append(names, name)
	}
	sort.Strings(names) // a deterministic order: the first error is always the same one
	for _, name := range names {
		f := fs.Lookup(name)
		if f == nil {
			return fmt.Errorf("config file %s: unknown setting %q", path, name)
		}
		if name == "config" || set[f.Value] {
			continue
		}
		list, isList := values[name].([]any)
		if !isList {
			list = []any{values[name]}
		}
		items := make([]string, len(list))
		for i, item := range list {
			items[i] = fmt.Sprint(item)
		}
		if err := setAll(fs, f, items); err != nil {
			return fmt.Errorf("config file %s: %s: %w", path, name, err)
		}
		set[f.Value] = true
	}
	return nil
}

// printUsage writes the synopsis and every flag with its type, meaning, default and (for the
// commands that read them) variable.
func printUsage(w io.Writer, fs *flag.FlagSet, synopsis string, withSettings bool) {
	fmt.Fprintf(w, "usage: %s\n\nflags", synopsis)
	if withSettings {
		fmt.Fprint(w, " (each also a SKEIN_* variable and a key of the --config YAML file)")
	}
	fmt.Fprintln(w, ":")
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		var notes []string
		if withSettings {
			notes = append(notes, envName(f.Name))
		}
		if f.DefValue != "" {
			notes = append(notes, "default "+f.DefValue)
		}
		fmt.Fprintf(w, "  --%s\n    \t%s", strings.TrimSpace(f.Name+" "+typ), usage)
		if len(notes) > 0 {
			fmt.Fprintf(w, " (%s)", strings.Join(notes, "; "))
		}
		fmt.Fprintln(w)
	})
}
